"""Hypothesis: on a real O_DIRECT file, a WAL writing its groups with io_uring (``aio="uring"``)
recovers exactly the untrimmed records that a dict model holds, across wraps, trims and reopens."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.directio import loop_writes_work
from wal import BlockWAL, WalConfig

CONFIG = WalConfig(
    capacity_bytes=1 << 20,
    record_max_bytes=16 << 10,
    batch_max_bytes=32 << 10,
    inflight_max_bytes=256 << 10,
    on_full="wait",
    aio="uring",
)

# a round: record sizes appended at once (one loop turn, so several groups in flight), then maybe
# a trim up to the k-th record appended so far, then maybe a close and reopen
ROUNDS = st.lists(
    st.tuples(
        st.lists(st.integers(0, CONFIG.record_max_bytes), min_size=1, max_size=24),
        st.booleans(),
        st.booleans(),
    ),
    min_size=1,
    max_size=12,
)


async def _run(path: Path, rounds: list[tuple[list[int], bool, bool]], seed: int) -> None:
    model: dict[int, bytes] = {}
    wal = await BlockWAL.open(path, CONFIG)
    assert [r async for r in wal.recover()] == []
    assert "io_uring" in wal.mode
    counter = seed
    for sizes, trim, reopen in rounds:
        bodies = []
        for size in sizes:
            counter += 1
            bodies.append((counter.to_bytes(8, "little") * (size // 8 + 1))[:size])
        offsets = await asyncio.gather(*(wal.append(b) for b in bodies))
        model.update(zip(offsets, bodies, strict=True))
        if trim or wal.used_bytes > CONFIG.record_area_bytes // 2:
            keep = sorted(model)[len(model) // 2]
            await wal.trim(keep)
            model = {o: b for o, b in model.items() if o >= keep}
        if reopen:
            await wal.close()
            wal = await BlockWAL.open(path, CONFIG)
            assert [(r.offset, r.data) async for r in wal.recover()] == sorted(model.items())
    await wal.close()
    wal = await BlockWAL.open(path, CONFIG)
    assert [(r.offset, r.data) async for r in wal.recover()] == sorted(model.items())
    await wal.close()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rounds=ROUNDS, seed=st.integers(0, 1 << 30))
def test_a_uring_wal_recovers_what_the_model_holds(
    rounds: list[tuple[list[int], bool, bool]], seed: int
) -> None:
    with tempfile.TemporaryDirectory() as directory:
        if not loop_writes_work(Path(directory), "uring"):
            pytest.skip("no io_uring or no O_DIRECT here")
        asyncio.run(_run(Path(directory) / "wal.dat", rounds, seed))
