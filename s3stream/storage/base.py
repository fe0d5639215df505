"""The ObjectStorage protocol: what the engine needs from an object store, and nothing more.

Three backends implement it (``local``, ``s3``, ``memory``); one contract test suite runs against all
of them. Keys are plain strings relative to the bucket (or root directory). Ranges are
``[start, end)``; ``end=None`` means "to the end of the object".

Errors: a missing key raises :class:`~s3stream.errors.NotFoundError`; a lost conditional create
raises :class:`~s3stream.errors.ConflictError`; transient failures that outlived the retry deadline
raise :class:`~s3stream.errors.UnavailableError`; bad keys or ranges raise
:class:`~s3stream.errors.InvalidArgumentError`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from s3stream.errors import InvalidArgumentError

MIN_PART_SIZE_BYTES = 5 * 1024 * 1024
"""S3's smallest multipart part (every part but the last)."""
MAX_PART_SIZE_BYTES = 5 * 1024 * 1024 * 1024
MAX_PART_COUNT = 10_000
MAX_DELETE_BATCH = 1000
"""DeleteObjects takes at most this many keys per call."""


def check_buffer_max_bytes(buffer_max_bytes: int | None) -> None:
    """Reject a ``buffer_max_bytes`` (of :meth:`ObjectStorage.upload`) that is not None or a positive int."""
    if buffer_max_bytes is not None and (
        isinstance(buffer_max_bytes, bool) or not isinstance(buffer_max_bytes, int) or buffer_max_bytes < 1
    ):
        raise InvalidArgumentError(
            f"buffer_max_bytes must be a positive int or None, got {buffer_max_bytes!r}"
        )


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    key: str
    size_bytes: int
    last_modified_s: float
    """Seconds since the epoch (UTC)."""
    etag: str = ""


@runtime_checkable
class Upload(Protocol):
    """One object being written in pieces; invisible until :meth:`complete` returns.

    Writes are buffered; small objects end as one PUT, larger ones as a multipart upload with parts
    of at least ``MIN_PART_SIZE_BYTES``. ``copy`` appends ``[start, end)`` of another object of the
    same store (server-side UploadPartCopy where the range is at least 5 MiB, read-and-write below).
    After ``abort`` (or a failed ``complete``) nothing of the object is visible.
    """

    key: str

    async def write(self, data: bytes | bytearray | memoryview) -> None: ...

    async def copy(self, source_key: str, start: int, end: int) -> None: ...

    async def complete(self) -> int:
        """Publish the object and return its size in bytes."""
        ...

    async def abort(self) -> None: ...


@runtime_checkable
class ObjectStorage(Protocol):
    """An object store: a flat namespace of immutable objects."""

    async def put(self, key: str, data: bytes | bytearray | memoryview, *, if_absent: bool = False) -> None:
        """Write a whole object atomically. ``if_absent`` makes it a conditional create."""
        ...

    def upload(self, key: str, *, buffer_max_bytes: int | None = None) -> Upload:
        """Start a streamed (possibly multipart) write of ``key``.

        ``buffer_max_bytes``: this upload may hold at most this many bytes buffered (written bytes not
        yet sent, parts in flight, a staged single-PUT body). The backend picks its part size, parts
        in flight and single-PUT threshold to stay under it, but never goes below one part of
        ``MIN_PART_SIZE_BYTES``: a limit under that still holds up to ``MIN_PART_SIZE_BYTES``.
        ``None``: the backend's own settings. A limit below 1 raises ``InvalidArgumentError``.
        """
        ...

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        """Read ``[start, end)`` of an object (``end=None``: to its end)."""
        ...

    async def head(self, key: str) -> ObjectInfo: ...

    async def delete(self, keys: Sequence[str]) -> None:
        """Delete keys (batched by the backend); keys that do not exist are ignored."""
        ...

    def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        """Every object whose key starts with ``prefix``, in key order, paging as needed."""
        ...

    async def close(self) -> None: ...
