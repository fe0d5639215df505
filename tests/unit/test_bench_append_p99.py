"""The ingest workload's append-p99 row against the minimal group-commit loop, its disk stalls, and
the CPU s/GiB of its throughput rows (real WAL files, real engine on the local store)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.baselines import Measured
from benchmarks.core import Context
from benchmarks.measure import LatencyRecorder
from benchmarks.workloads import ingest

KiB = 1024
MiB = 1024 * KiB
P99 = "append p99 latency at half max rate (1 KiB records, uploads running)"


def test_disk_stalls_count_group_writes_over_the_threshold() -> None:
    stalls = ingest.disk_stalls([0.001, 0.019, 0.021, 0.5])
    assert stalls == {"threshold_ms": 20.0, "count": 2, "group_writes": 4, "max_ms": 500.0}
    assert ingest.disk_stalls(None)["group_writes"] == 0


async def test_the_minimal_loop_and_the_engine_are_paced_alike_and_time_their_group_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ingest, "WARMUP_S", 0.1)
    ctx = Context(quick=True, work_dir=tmp_path, s3=None)
    latency, stalls = await ingest._minimal_loop_latency(
        ctx, record_bytes=KiB, rate_per_s=1000.0, duration_s=0.3
    )
    assert latency.count == 300
    assert 0 < stalls["group_writes"] <= 300
    assert stalls["max_ms"] > 0

    engine_stalls: dict[str, float] = {}
    engine_latency, *_ = await ingest._engine_latency(
        ctx, record_bytes=KiB, stream_count=4, rate_per_s=1000.0, duration_s=0.3, stalls=engine_stalls
    )
    assert engine_latency.count == 300
    assert engine_stalls["threshold_ms"] == 20.0
    assert 0 < engine_stalls["group_writes"] <= 300


async def test_the_throughput_sections_report_cpu_per_gib(tmp_path: Path) -> None:
    ctx = Context(quick=True, work_dir=tmp_path, s3=None)
    wal_cpu: list[float] = []
    await ingest._wal_alone(
        ctx, "wal", record_bytes=KiB, total_bytes=2 * MiB, producers=8, cpu_s_per_gib=wal_cpu
    )
    assert len(wal_cpu) == 1
    assert wal_cpu[0] > 0
    run = await ingest._engine_ingest(ctx, record_bytes=KiB, total_bytes=2 * MiB, stream_count=4, producers=8)
    # through the drain includes the appends: never less than the appends alone
    assert run["cpu_s_per_gib_drain"] >= run["cpu_s_per_gib_ingest"] > 0


async def test_the_p99_row_compares_with_the_minimal_loop_and_carries_the_stalls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def wal_alone(ctx: Context, name: str, **kw: object) -> tuple[float, LatencyRecorder]:
        latency = LatencyRecorder()
        latency.record(0.004)
        cpu = kw.get("cpu_s_per_gib")
        if isinstance(cpu, list):
            cpu.append(2.0)
        return 100.0, latency

    async def engine(ctx: Context, **kw: object) -> dict[str, float]:
        return {"ingest_mb_s": 80.0, "drain_mb_s": 70.0, "payload_bytes": 1, "put_requests": 0, "naive_puts": 0,
                "uploads": 0, "upload_mb_s": 50.0, "objects": 0, "cpu_s_per_gib_ingest": 2.5,
                "cpu_s_per_gib_drain": 3.0}  # fmt: skip

    async def raw_put(ctx: Context) -> tuple[str, Measured]:
        return "raw", Measured("raw", payload_bytes=1_000_000, elapsed_s=1.0)

    async def engine_latency(ctx: Context, **kw: object) -> tuple[object, ...]:
        stalls = kw["stalls"]
        assert isinstance(stalls, dict)
        stalls.update(ingest.disk_stalls([0.03, 0.001]))
        latency = LatencyRecorder()
        latency.record(0.003)
        return latency, 1, latency, ingest.GcPauses(), 0, ingest.YoungCollections()

    async def minimal_loop(ctx: Context, **kw: object) -> tuple[LatencyRecorder, dict[str, float]]:
        latency = LatencyRecorder()
        latency.record(0.002)
        return latency, ingest.disk_stalls([0.001])

    async def floor(rate_per_s: float, duration_s: float) -> LatencyRecorder:
        return LatencyRecorder()

    async def put_load(ctx: Context, **kw: object) -> tuple[object, ...]:
        return LatencyRecorder(), ingest.ThreadTimes(), ingest.PacerStats(), 0

    for name, fake in (("_wal_alone", wal_alone), ("_engine_ingest", engine), ("_raw_put", raw_put),
                       ("_engine_latency", engine_latency), ("_minimal_loop_latency", minimal_loop),
                       ("_paced_floor", floor), ("_wal_alone_under_put_load", put_load)):  # fmt: skip
        monkeypatch.setattr(ingest, name, fake)
    results = {r.metric: r for r in await ingest.run(Context(quick=True, work_dir=tmp_path, s3=None))}
    p99 = results[P99]
    assert p99.baseline.startswith("minimal group-commit loop")
    assert (p99.value, p99.baseline_value) == (3.0, 2.0)
    assert p99.extra["wal_alone_p99_ms"] == 4.0
    assert p99.extra["disk_stalls"]["engine"]["count"] == 1
    assert p99.extra["disk_stalls"]["minimal_loop"]["count"] == 0
    ingest_1k = results["ingest MB/s (1 KiB records, 1000 streams)"]
    assert (ingest_1k.cpu_s_per_gib, ingest_1k.baseline_cpu_s_per_gib) == (3.0, 2.0)
    held = results["ingest MB/s, uploads held back until the end (1 KiB records, 1000 streams)"]
    assert (held.cpu_s_per_gib, held.baseline_cpu_s_per_gib) == (2.5, 2.0)
