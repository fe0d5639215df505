"""Value types of the public API."""

from __future__ import annotations

from dataclasses import dataclass

from s3stream.errors import InvalidArgumentError

_COUNT_LIMIT = 1 << 31
"""``count`` is persisted as a u32 holding at most 2**31 - 1 (docs/format.md)."""


@dataclass(frozen=True, slots=True, init=False)
class RecordBatch:
    """What a producer appends: an opaque payload covering ``count`` offsets.

    Like AutoMQ, only ``count`` and ``payload`` are persisted.
    """

    payload: bytes | bytearray | memoryview
    count: int = 1

    def __init__(self, payload: bytes | bytearray | memoryview, count: int = 1) -> None:
        # Hand-written (one is built per append): the generated frozen __init__ plus __post_init__
        # cost twice as much. Same checks; fields set through their slots (the class is frozen).
        if payload.__class__ is not bytes and not isinstance(payload, bytes | bytearray | memoryview):
            raise InvalidArgumentError(f"payload must be bytes, not {type(payload).__name__}")
        if count.__class__ is not int and (isinstance(count, bool) or not isinstance(count, int)):
            raise InvalidArgumentError(f"count must be a positive int, got {count!r}")
        if count <= 0:
            raise InvalidArgumentError(f"count must be a positive int, got {count!r}")
        if count >= _COUNT_LIMIT:
            raise InvalidArgumentError(f"count {count} does not fit in 32 bits")
        _set_payload(self, payload)
        _set_count(self, count)


_set_payload = RecordBatch.__dict__["payload"].__set__
_set_count = RecordBatch.__dict__["count"].__set__


@dataclass(frozen=True, slots=True)
class FetchedBatch:
    """A batch returned by fetch: ``[base_offset, end_offset)`` and its payload.

    Fetch returns the engine's own records, a subclass that also carries the stream id and epoch
    (:class:`s3stream.record.StreamRecordBatch`): no copy per record. Equality is per class, as for
    any dataclass: compare fields (``base_offset``, ``count``, ``payload``) rather than objects.
    """

    base_offset: int
    count: int
    payload: bytes

    @property
    def end_offset(self) -> int:
        return self.base_offset + self.count
