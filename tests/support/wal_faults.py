"""A fault-injecting device for tests: loses unsynced writes, tears sectors, fails on demand.

The fault model (what a power cut can do to a disk with a volatile write cache):
* every write acknowledged by ``sync`` survives;
* a write not yet synced may survive whole, vanish, or survive in part: each sector independently
  (``crash(mode="sectors")``), or only a prefix of it, the last sector cut mid-way
  (``crash(mode="tear")``);
* nothing else changes: bytes never written keep their old value.
"""

from __future__ import annotations

import mmap
import random
import threading
from typing import Literal

from wal.errors import WalIOError


class FaultyDevice:
    mode = "faulty-memory"

    def __init__(self, size_bytes: int, data: bytearray | None = None, *, sector_bytes: int = 512) -> None:
        self.size_bytes = size_bytes
        self.sector_bytes = sector_bytes
        self.durable = bytearray(data) if data is not None else bytearray(size_bytes)
        self.current = bytearray(self.durable)
        self.unsynced: list[tuple[int, bytes]] = []
        self.fail_after_writes: int | None = None
        """When set, the write after this many more writes raises WalIOError."""
        self.writes = 0
        self.syncs = 0
        self.closed = False
        self._lock = threading.Lock()

    def write(self, pos: int, data: bytes | bytearray | memoryview | mmap.mmap) -> None:
        with self._lock:
            self._write(pos, data)

    def _write(self, pos: int, data: bytes | bytearray | memoryview | mmap.mmap) -> None:
        if self.fail_after_writes is not None:
            if self.fail_after_writes <= 0:
                raise WalIOError("injected write failure")
            self.fail_after_writes -= 1
        chunk = bytes(data)
        if pos < 0 or pos + len(chunk) > self.size_bytes:
            raise WalIOError(f"write of {len(chunk)} bytes at {pos} beyond device end")
        self.current[pos : pos + len(chunk)] = chunk
        self.unsynced.append((pos, chunk))
        self.writes += 1

    def read_into(self, pos: int, buf: memoryview) -> int:
        n = max(0, min(len(buf), self.size_bytes - pos))
        buf[:n] = self.current[pos : pos + n]
        return n

    def sync(self) -> None:
        with self._lock:
            self._sync()

    def _sync(self) -> None:
        for pos, chunk in self.unsynced:
            self.durable[pos : pos + len(chunk)] = chunk
        self.unsynced.clear()
        self.syncs += 1

    def close(self) -> None:
        self.closed = True

    def crash(self, rng: random.Random, mode: Literal["drop", "sectors", "tear"] = "sectors") -> bytearray:
        """The device image a power cut would leave now (this device is unchanged)."""
        with self._lock:
            return self._crash(rng, mode)

    def _crash(self, rng: random.Random, mode: str) -> bytearray:
        image = bytearray(self.durable)
        if mode == "drop" or not self.unsynced:
            return image
        sector = self.sector_bytes
        if mode == "sectors":
            for pos, chunk in self.unsynced:
                for k in range(0, len(chunk), sector):
                    if rng.random() < 0.5:
                        image[pos + k : pos + k + sector] = chunk[k : k + sector]
            return image
        # tear: earlier unsynced writes land whole, the last lands as a prefix cut inside a sector
        for pos, chunk in self.unsynced[:-1]:
            image[pos : pos + len(chunk)] = chunk
        pos, chunk = self.unsynced[-1]
        cut = rng.randrange(0, len(chunk) + 1)
        if cut % sector == 0 and cut < len(chunk):
            cut += rng.randrange(1, sector)
        image[pos : pos + cut] = chunk[:cut]
        return image
