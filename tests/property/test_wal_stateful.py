"""Hypothesis state machine: random appends, trims, crashes (torn, dropped) and reopens against a model."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Coroutine
from typing import Any, Literal, TypeVar

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from tests.support.wal_faults import FaultyDevice
from wal import BlockWAL, WalCapacityError, WalConfig, WalIOError

T = TypeVar("T")

CONFIG = WalConfig(
    capacity_bytes=128 << 10,
    record_max_bytes=2 << 10,
    batch_max_bytes=4 << 10,
    inflight_max_bytes=16 << 10,
    direct_io="off",
)


class WalMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.device = FaultyDevice(CONFIG.device_bytes)
        self.wal = self.run(BlockWAL.open(self.device, CONFIG))
        self.acked: dict[int, bytes] = {}
        self.attempted: set[bytes] = set()
        self.trim_requested = 0
        self.trim_durable = 0
        self.counter = 0
        self.cycles = 0

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def new_data(self, size: int) -> bytes:
        self.counter += 1
        data = self.counter.to_bytes(4, "big") + bytes([self.counter % 251]) * max(0, size - 4)
        self.attempted.add(data)
        return data

    async def _appends(self, sizes: list[int], many: bool) -> list[tuple[int, bytes] | None]:
        datas = [self.new_data(s) for s in sizes]
        if many:
            try:
                return list(zip(await self.wal.append_many(datas), datas, strict=True))
            except WalCapacityError:
                return [None]
        results = await asyncio.gather(*(self.wal.append(d) for d in datas), return_exceptions=True)
        out: list[tuple[int, bytes] | None] = []
        for r, d in zip(results, datas, strict=True):
            if isinstance(r, WalCapacityError):
                out.append(None)
            elif isinstance(r, BaseException):
                raise r
            else:
                out.append((r, d))
        return out

    @rule(
        sizes=st.lists(st.integers(0, CONFIG.record_max_bytes), min_size=1, max_size=12), many=st.booleans()
    )
    def append(self, sizes: list[int], many: bool) -> None:
        for item in self.run(self._appends(sizes, many)):
            if item is not None:
                self.acked[item[0]] = item[1]

    @rule(pick=st.floats(0, 1.2))
    def trim(self, pick: float) -> None:
        offsets = sorted(self.acked)
        target = self.wal.next_offset if pick > 1 or not offsets else offsets[int(pick * (len(offsets) - 1))]
        self.trim_requested = max(self.trim_requested, target)
        self.run(self.wal.trim(target))
        self.trim_durable = max(self.trim_durable, target)
        self.acked = {o: d for o, d in self.acked.items() if o >= target}

    @rule()
    def clean_reopen(self) -> None:
        self.run(self.wal.close())
        self.reopen(bytearray(self.device.durable))

    @rule(
        sizes=st.lists(st.integers(0, CONFIG.record_max_bytes), min_size=1, max_size=12),
        steps=st.integers(0, 6),
        mode=st.sampled_from(["drop", "sectors", "tear"]),
        seed=st.integers(0, 1 << 16),
    )
    def crash_reopen(
        self, sizes: list[int], steps: int, mode: Literal["drop", "sectors", "tear"], seed: int
    ) -> None:
        self.reopen(self.run(self._crash(sizes, steps, mode, seed)))

    @rule(
        sizes=st.lists(st.integers(0, CONFIG.record_max_bytes), min_size=1, max_size=12),
        steps=st.integers(0, 6),
        mode=st.sampled_from(["drop", "sectors", "tear"]),
        recovery_writes=st.integers(0, 2),
        seed=st.integers(0, 1 << 16),
    )
    def crash_during_recovery(
        self, sizes: list[int], steps: int, mode: Literal["drop", "sectors", "tear"], recovery_writes: int,
        seed: int,
    ) -> None:  # fmt: skip
        """A crash, then a second one while the next open recovers, after ``recovery_writes`` of its
        writes (the bridge over the torn tail, then the new header) landed and before the next."""
        image = self.run(self._crash(sizes, steps, mode, seed))
        device = FaultyDevice(len(image), image)
        device.fail_after_writes = recovery_writes  # the write after these raises: the process dies there
        wal = self.run(BlockWAL.open(device, CONFIG))
        with contextlib.suppress(WalIOError):
            self.run(wal.recover_all())  # what it returns is checked by the recovery after the crash
        wal._fail(WalIOError("simulated crash"))
        self.run(wal._release())
        self.reopen(device.crash(random.Random(seed), "drop"))

    async def _crash(
        self, sizes: list[int], steps: int, mode: Literal["drop", "sectors", "tear"], seed: int
    ) -> bytearray:
        """Appends ``sizes``, lets the loop run ``steps`` times, and crashes: the device image left."""
        datas = [self.new_data(s) for s in sizes]
        tasks = [asyncio.ensure_future(self.wal.append(d)) for d in datas]
        for _ in range(steps):
            await asyncio.sleep(0)
        for t, d in zip(tasks, datas, strict=True):
            if t.done() and t.exception() is None:
                self.acked[t.result()] = d
        image = self.device.crash(random.Random(seed), mode)
        # the process "dies": the old handle stops (its later writes land on the old device only)
        self.wal._fail(WalIOError("simulated crash"))
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.wal._release()
        return image

    def reopen(self, image: bytearray) -> None:
        self.cycles += 1
        self.device = FaultyDevice(len(image), image)
        self.wal = self.run(BlockWAL.open(self.device, CONFIG))
        recovered = self.run(self.wal.recover_all())
        offsets = [r.offset for r in recovered]
        assert offsets == sorted(set(offsets))
        got = {r.offset: r.data for r in recovered}
        for o, d in got.items():
            assert d in self.attempted, f"phantom record at {o}"
            if o in self.acked:
                assert self.acked[o] == d, f"record at {o} changed"
            assert o >= self.trim_durable, f"record at {o} below the durable trim {self.trim_durable}"
        lost = [o for o in self.acked if o >= self.trim_requested and o not in got]
        assert not lost, f"acknowledged records lost: {lost[:5]}"
        self.acked = got

    @invariant()
    def offsets_only_grow(self) -> None:
        assert self.wal.next_offset >= max(self.acked, default=0)

    def teardown(self) -> None:
        if not self.wal._closed:
            self.run(self.wal.close())
        self.loop.close()


WalMachine.TestCase.settings = settings(
    max_examples=40, stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestWalStateful = WalMachine.TestCase
