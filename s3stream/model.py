"""Value types of the public API."""

from __future__ import annotations

from dataclasses import dataclass

from s3stream.errors import InvalidArgumentError


@dataclass(frozen=True, slots=True)
class RecordBatch:
    """What a producer appends: an opaque payload covering ``count`` offsets.

    Like AutoMQ, only ``count`` and ``payload`` are persisted.
    """

    payload: bytes | bytearray | memoryview
    count: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.payload, bytes | bytearray | memoryview):
            raise InvalidArgumentError(f"payload must be bytes, not {type(self.payload).__name__}")
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count <= 0:
            raise InvalidArgumentError(f"count must be a positive int, got {self.count!r}")
        if self.count >= 1 << 31:
            raise InvalidArgumentError(f"count {self.count} does not fit in 32 bits")


@dataclass(frozen=True, slots=True)
class FetchedBatch:
    """A batch returned by fetch: ``[base_offset, end_offset)`` and its payload."""

    base_offset: int
    count: int
    payload: bytes

    @property
    def end_offset(self) -> int:
        return self.base_offset + self.count
