"""The ingest workload: its paced latency method (open loop without coordinated omission), its WAL settings."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from benchmarks.baselines import Measured
from benchmarks.core import Context
from benchmarks.measure import LatencyRecorder
from benchmarks.workloads import ingest
from benchmarks.workloads.ingest import _paced, _paced_floor
from s3stream.assembly import open_block_wal, open_client
from s3stream.config import Config

KiB = 1024
MiB = 1024 * KiB


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


async def test_the_held_back_engine_gets_the_held_back_wal_capacity(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    capacities: list[int] = []

    async def client_spy(root: Path, *, config: Config, storage: object) -> object:
        capacities.append(config.wal_capacity_bytes)
        return await open_client(root, config=config, storage=storage)  # type: ignore[arg-type]

    monkeypatch.setattr(ingest, "open_client", client_spy)
    ctx = Context(quick=True, work_dir=tmp_path, s3=None)
    total = 4 * MiB
    await ingest._engine_ingest(
        ctx, record_bytes=64 * KiB, total_bytes=total, stream_count=2, producers=4, hold_uploads=True
    )
    assert capacities == [ingest._held_wal_capacity(total)]


def _fake_measurements(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every measurement ingest.run makes, faked: the WAL alone's MB/s is its capacity in MiB."""
    default = Config().wal_capacity_bytes

    async def wal_alone(ctx: Context, name: str, **kw: int) -> tuple[float, LatencyRecorder]:
        capacity = kw.get("capacity_bytes", default)
        latency = LatencyRecorder()
        latency.record(0.001)
        return float(capacity // MiB), latency  # the baseline's value tells which WAL it came from

    async def engine(ctx: Context, **kw: object) -> dict[str, float]:
        return {"ingest_mb_s": 1.0, "drain_mb_s": 1.0, "payload_bytes": 1, "put_requests": 0, "naive_puts": 0,
                "uploads": 0, "upload_mb_s": 0.0, "objects": 0}  # fmt: skip

    async def raw_put(ctx: Context) -> tuple[str, Measured]:
        return "raw", Measured("raw", payload_bytes=1_000_000, elapsed_s=1.0)

    async def engine_latency(ctx: Context, **kw: object) -> tuple[object, ...]:
        latency = LatencyRecorder()
        latency.record(0.001)
        return latency, 0, latency, ingest.GcPauses(), 0, ingest.YoungCollections()

    async def floor(rate_per_s: float, duration_s: float) -> LatencyRecorder:
        return LatencyRecorder()

    async def minimal_loop(ctx: Context, **kw: object) -> tuple[LatencyRecorder, dict[str, float]]:
        latency = LatencyRecorder()
        latency.record(0.0005)
        return latency, ingest.disk_stalls([0.001, 0.03])

    for name, fake in (("_wal_alone", wal_alone), ("_engine_ingest", engine), ("_raw_put", raw_put),
                       ("_engine_latency", engine_latency), ("_paced_floor", floor),
                       ("_minimal_loop_latency", minimal_loop)):  # fmt: skip
        monkeypatch.setattr(ingest, name, fake)


async def test_the_held_back_rows_wal_alone_has_the_held_back_engines_wal_capacity(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The held-back engine writes once into a WAL of _held_wal_capacity; its baseline does too (not
    around the default 256 MiB WAL, which this VM's disk wrote faster than a fresh 2 GiB one)."""
    default = Config().wal_capacity_bytes
    _fake_measurements(monkeypatch)
    results = await ingest.run(Context(quick=False, work_dir=tmp_path, s3=None))
    baselines = {r.metric: r.baseline_value for r in results}
    for size, total in ((1, 64 * MiB), (64, 1024 * MiB)):
        label = f"{size} KiB records, 1000 streams"
        assert baselines[f"ingest MB/s ({label})"] == default // MiB
        assert baselines[f"ingest MB/s, uploads held back until the end ({label})"] == (
            ingest._held_wal_capacity(total) // MiB
        )
    assert ingest._held_wal_capacity(1024 * MiB) == 2048 * MiB


async def test_the_held_back_pairs_alternate_in_fresh_directories(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []

    async def wal_alone(ctx: Context, name: str, **kw: int) -> tuple[float, LatencyRecorder]:
        calls.append(name)
        (ctx.scratch(name) / "wal").write_bytes(b"x")
        return 100.0 + len(calls), LatencyRecorder()

    async def engine(ctx: Context, **kw: object) -> dict[str, float]:
        assert kw["hold_uploads"] is True
        calls.append(f"engine{kw['tag']}")
        return {"ingest_mb_s": 10.0 * len(calls)}

    monkeypatch.setattr(ingest, "_wal_alone", wal_alone)
    monkeypatch.setattr(ingest, "_engine_ingest", engine)
    ctx = Context(quick=True, work_dir=tmp_path, s3=None)
    wal_runs, engine_runs = await ingest._held_back_rounds(
        ctx, record_bytes=KiB, total_bytes=MiB, stream_count=2, producers=2, rounds=3
    )
    assert calls == [
        "wal-held-1024-r0",
        "engine-r0",
        "engine-r1",
        "wal-held-1024-r1",
        "wal-held-1024-r2",
        "engine-r2",
    ]
    assert wal_runs == [101.0, 104.0, 105.0]
    assert [run["ingest_mb_s"] for run in engine_runs] == [20.0, 30.0, 60.0]
    assert not any(tmp_path.iterdir())  # each round's scratch removed


async def test_the_held_back_row_gives_the_median_of_each_side(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def rounds(
        ctx: Context, *, record_bytes: int, rounds: int, **kw: int
    ) -> tuple[list[float], list[dict[str, float]]]:
        if record_bytes == KiB:
            assert rounds == ingest.HELD_ROUNDS_1K == 3
            return [300.0, 100.0, 200.0], [
                {"ingest_mb_s": v, "uploads": i} for i, v in enumerate((90.0, 250.0, 150.0))
            ]
        assert rounds == 1
        return [1000.0], [{"ingest_mb_s": 900.0, "uploads": 7}]

    _fake_measurements(monkeypatch)
    monkeypatch.setattr(ingest, "_held_back_rounds", rounds)
    results = await ingest.run(Context(quick=False, work_dir=tmp_path, s3=None))
    rows = {r.metric: r for r in results}
    small = rows["ingest MB/s, uploads held back until the end (1 KiB records, 1000 streams)"]
    assert (small.value, small.baseline_value) == (150.0, 200.0)
    assert small.extra["uploads"] == 2  # the median engine run's own extras
    assert small.extra["ratio_rounds"] == [0.3, 2.5, 0.75]
    large = rows["ingest MB/s, uploads held back until the end (64 KiB records, 1000 streams)"]
    assert (large.value, large.baseline_value, large.extra["rounds"]) == (900.0, 1000.0, 1)
