"""A synchronous facade over :class:`BlockWAL` for callers without an event loop: one loop thread."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from wal.config import WalConfig
from wal.device import Device
from wal.recovery import WalRecord
from wal.service import BlockWAL, Body, BodyParts

T = TypeVar("T")


class SyncBlockWAL:
    """Blocking methods that run the async WAL on a private event loop thread. No logic of its own."""

    def __init__(self, path: str | os.PathLike[str] | Device, config: WalConfig) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="wal-loop", daemon=True)
        self._thread.start()
        try:
            self._wal = self._call(BlockWAL.open(path, config))
        except BaseException:
            self._stop()
            raise

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    @property
    def mode(self) -> str:
        return self._wal.mode

    @property
    def next_offset(self) -> int:
        return self._wal.next_offset

    @property
    def trim_offset(self) -> int:
        return self._wal.trim_offset

    @property
    def capacity_bytes(self) -> int:
        return self._wal.capacity_bytes

    def recover(self) -> list[WalRecord]:
        return self._call(self._wal.recover_all())

    def append(self, data: BodyParts) -> int:
        return self._call(self._append(data))

    async def _append(self, data: BodyParts) -> int:
        return await self._wal.append(data)

    def append_many(self, records: Sequence[Body]) -> list[int]:
        return self._call(self._wal.append_many(records))

    def trim(self, offset: int) -> None:
        self._call(self._wal.trim(offset))

    def close(self) -> None:
        try:
            self._call(self._wal.close())
        finally:
            self._stop()

    def _stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> SyncBlockWAL:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
