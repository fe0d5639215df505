"""A WAL twin that a test can make fail or hang: :class:`FaultyMemoryWal`."""

from __future__ import annotations

import asyncio

from s3stream.engine.walport import BodyParts, MemoryWal
from s3stream.errors import ClosedError


class FaultyMemoryWal(MemoryWal):
    """:class:`~s3stream.engine.walport.MemoryWal` with two faults a test sets while it runs."""

    def __init__(self, *, capacity_bytes: int, record_max_bytes: int | None = None) -> None:
        super().__init__(capacity_bytes=capacity_bytes, record_max_bytes=record_max_bytes)
        self.fail_next: BaseException | None = None
        """The next append (once admitted) raises this instead of writing."""
        self.gate: asyncio.Event | None = None
        """Appends write, then wait for this event before completing (a device that hangs)."""

    async def append(self, body: BodyParts) -> int:
        size = self._admit(body)
        if self.fail_next is not None:
            exc, self.fail_next = self.fail_next, None
            raise exc
        offset = self._store(body, size)
        if self.gate is None:
            await asyncio.sleep(0)
            return offset
        await self.gate.wait()
        if self.closed:
            raise ClosedError("WAL closed while the append was in flight")
        return offset

    async def close(self) -> None:
        await super().close()
        if self.gate is not None:
            self.gate.set()

    def reopen(self) -> FaultyMemoryWal:
        """The same log after a restart, its faults cleared."""
        super().reopen()
        self.gate = None
        self.fail_next = None
        return self
