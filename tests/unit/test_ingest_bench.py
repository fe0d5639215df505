"""The ingest workload: its paced latency method (open loop without coordinated omission), its WAL settings."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from benchmarks.core import Context
from benchmarks.workloads import ingest
from benchmarks.workloads.ingest import _paced, _paced_floor
from s3stream.assembly import open_block_wal, open_client
from s3stream.config import Config


async def _hold_loop(after_s: float, hold_s: float) -> None:
    await asyncio.sleep(after_s)
    time.sleep(hold_s)  # the loop is held: sends due meanwhile slip


async def test_a_held_loop_shows_in_the_latency_not_only_in_the_send_lag() -> None:
    holder = asyncio.ensure_future(_hold_loop(0.05, 0.1))
    floor = await _paced_floor(2000.0, 0.4)
    await holder
    assert floor.count == 800
    # The sends due during the 100 ms hold went out late; their latency runs from their due time.
    assert floor.percentile_s(1.0) >= 0.08
    assert floor.percentile_s(0.9) >= 0.01


async def test_every_slot_is_called_once_with_its_due_time() -> None:
    dues: list[float] = []

    async def one(due: float) -> None:
        dues.append(due)

    started = time.perf_counter()
    await _paced(one, 300, 3000.0)
    assert len(set(dues)) == 300
    assert min(dues) >= started
    assert max(dues) - min(dues) > 0.09


@pytest.mark.parametrize("params", [{"wal_aio": "auto"}, {"wal_aio": "off"}, {}])
async def test_wal_aio_param_sets_the_engine_and_the_wal_alone_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, params: dict[str, str]
) -> None:
    seen: list[str] = []

    async def wal_spy(path: Path, config: Config, *, node_epoch: int) -> object:
        seen.append(config.wal_aio)
        return await open_block_wal(path, config, node_epoch=node_epoch)

    async def client_spy(root: Path, *, config: Config, storage: object) -> object:
        seen.append(config.wal_aio)
        return await open_client(root, config=config, storage=storage)  # type: ignore[arg-type]

    monkeypatch.setattr(ingest, "open_block_wal", wal_spy)
    monkeypatch.setattr(ingest, "open_client", client_spy)
    ctx = Context(quick=True, work_dir=tmp_path, s3=None, params=params)
    await ingest._wal_alone(ctx, "wal", record_bytes=1024, total_bytes=64 * 1024, producers=4)
    await ingest._engine_ingest(ctx, record_bytes=1024, total_bytes=64 * 1024, stream_count=2, producers=4)
    await ingest._engine_ingest(
        ctx, record_bytes=1024, total_bytes=64 * 1024, stream_count=2, producers=4, hold_uploads=True
    )
    assert seen == [params.get("wal_aio", Config().wal_aio)] * 3
