"""The engine's view of a write-ahead log, and its in-memory twin.

The engine needs four things from a WAL: append a body durably (getting its logical offset), trim
everything below an offset, recover the untrimmed records in offset order after a restart, and
close. :class:`WriteAheadLog` is that seam; :class:`MemoryWal` is the twin used by fast unit tests;
``s3stream.assembly`` adapts the block WAL of ``wal/`` to it (translating its errors there).

Errors a WAL raises through this seam: :class:`~s3stream.errors.CapacityError` (full: trim first),
:class:`~s3stream.errors.ClosedError`, :class:`~s3stream.errors.InvalidArgumentError` (body too
large), :class:`~s3stream.errors.UnavailableError` (I/O failed).

A WAL that translates its own error kinds in a wrapper (the block WAL's adapter) may also offer
``append_untranslated`` (the wrapped append itself) and ``translate_error(exc)`` (the exception the
wrapper would raise instead): the engine's plain-append hot path then awaits the wrapped append
directly, one coroutine frame less per append, and translates a failure itself (see
:func:`fast_append`).

A body is handed over as one bytes-like object or as a list or tuple of parts written back to back as
one record (e.g. a record header and the caller's payload, so no append copies its payload to join
them); recovery returns the joined body either way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeAlias

from s3stream.errors import CapacityError, ClosedError, InvalidArgumentError

MEMORY_RECORD_OVERHEAD_BYTES = 24
"""Space a record header takes in :class:`MemoryWal` (the block WAL's record header size)."""


Body: TypeAlias = bytes | bytearray | memoryview
"""One bytes-like piece of a WAL record body (C-contiguous, byte-sized items)."""

BodyParts: TypeAlias = Body | list[Body] | tuple[Body, ...]
"""What :meth:`WriteAheadLog.append` takes: a body, or a list or tuple of parts making the body back to
back (only lists and tuples count as parts: any other object is one body)."""


def body_size(body: BodyParts) -> int:
    """The byte count of a body given whole or as parts."""
    if isinstance(body, list | tuple):
        return sum(map(len, body))
    return len(body)


class WriteAheadLog(Protocol):
    async def append(self, body: BodyParts) -> int:
        """Write ``body`` (whole or as parts) durably as one record; returns its logical offset.
        Offsets grow with submission order. The bytes must not change until the call returns."""
        ...

    async def trim(self, offset: int) -> None:
        """Forget every record whose offset is below ``offset``."""
        ...

    async def recover(self) -> list[tuple[int, bytes]]:
        """The untrimmed records ``(offset, body)`` in offset order (call once, before appending)."""
        ...

    async def close(self) -> None: ...


def fast_append(
    wal: WriteAheadLog,
) -> tuple[Callable[[BodyParts], Awaitable[int]], Callable[[BaseException], BaseException] | None]:
    """The append the hot path awaits and the translation its failures need (None: none needed)."""
    untranslated = getattr(wal, "append_untranslated", None)
    translate = getattr(wal, "translate_error", None)
    if untranslated is None or translate is None:
        return wal.append, None
    return untranslated, translate


class MemoryWal:
    """An in-memory WAL with a byte capacity. Offsets are byte positions, as in the block WAL.

    ``records`` survives :meth:`close`, so a test can "restart" on the same instance with
    :meth:`reopen` (everything appended counts as durable: this twin models no torn writes).
    """

    def __init__(self, *, capacity_bytes: int, record_max_bytes: int | None = None) -> None:
        self.capacity_bytes = capacity_bytes
        self.record_max_bytes = record_max_bytes or capacity_bytes // 4
        self.records: dict[int, bytes] = {}
        self.next_offset = 0
        self.trim_offset = 0
        self.used_bytes = 0
        self.closed = False
        self.append_count = 0
        self.trim_calls: list[int] = []

    async def append(self, body: BodyParts) -> int:
        offset = self._store(body, self._admit(body))
        await asyncio.sleep(0)
        return offset

    def _admit(self, body: BodyParts) -> int:
        """The bytes ``body`` takes in the WAL; raises if the WAL is closed, the record too large or
        the WAL full."""
        if self.closed:
            raise ClosedError("WAL is closed")
        length = body_size(body)
        if length > self.record_max_bytes:
            raise InvalidArgumentError(f"WAL record of {length} bytes is above {self.record_max_bytes}")
        size = length + MEMORY_RECORD_OVERHEAD_BYTES
        if self.used_bytes + size > self.capacity_bytes:
            raise CapacityError(f"WAL full: {self.used_bytes} of {self.capacity_bytes} bytes used")
        return size

    def _store(self, body: BodyParts, size: int) -> int:
        """Write ``body`` (admitted at ``size`` bytes) as the next record; returns its offset."""
        offset = self.next_offset
        self.next_offset += size
        self.used_bytes += size
        # Stored joined, as the block WAL's recovery returns it (parts are copied here, in the twin).
        self.records[offset] = b"".join(body) if isinstance(body, list | tuple) else bytes(body)
        self.append_count += 1
        return offset

    async def trim(self, offset: int) -> None:
        if self.closed:
            raise ClosedError("WAL is closed")
        self.trim_calls.append(offset)
        if offset <= self.trim_offset:
            return
        self.trim_offset = offset
        for record_offset in [o for o in self.records if o < offset]:
            self.used_bytes -= len(self.records.pop(record_offset)) + MEMORY_RECORD_OVERHEAD_BYTES

    async def recover(self) -> list[tuple[int, bytes]]:
        return sorted(self.records.items())

    async def close(self) -> None:
        self.closed = True

    def reopen(self) -> MemoryWal:
        """The same log after a restart."""
        self.closed = False
        return self
