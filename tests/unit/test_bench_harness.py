"""The benchmark harness end to end with tiny fake workloads, and the shared measurement helpers."""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import signal
from pathlib import Path

import pytest

from benchmarks import harness
from benchmarks.baselines import (
    DurableWriteSpec,
    naive_writer,
    odirect_write_sync,
    raw_s3_put_get,
    slatedb_writer,
)
from benchmarks.core import Context, Result
from benchmarks.measure import MIB, CountingStorage, LatencyRecorder, RequestCounter, ResourceMeter, per_gib
from benchmarks.report import SCHEMA
from s3stream.errors import NotFoundError
from s3stream.storage.memory import MemoryObjectStorage
from tests.support.s3 import S3TestServer

RESULT_KEYS = {
    "workload",
    "metric",
    "value",
    "unit",
    "baseline",
    "baseline_value",
    "ratio",
    "higher_is_better",
    "extra",
    "cpu_s_per_gib",
    "baseline_cpu_s_per_gib",
    "cpu_ratio",
}


async def fake_workload(ctx: Context) -> list[Result]:
    """Writes a few objects through the context's store and reports them against a sleep baseline."""
    ctx.status("writing")
    storage = CountingStorage(ctx.open_storage("fake"))
    latency = LatencyRecorder()
    payload = b"x" * 4096
    try:
        for index in range(ctx.scale(quick=20, full=200)):
            with latency.time():
                await storage.put(f"k{index:04d}", payload)
        written = storage.counter.bytes_written
    finally:
        await storage.close()
    baseline = LatencyRecorder()
    for _ in range(5):
        with baseline.time():
            await asyncio.sleep(0.001)
    return [
        Result(
            workload="fake",
            metric="put throughput",
            value=latency.count / max(latency.total_s, 1e-9),
            unit="ops/s",
            baseline="1 ms sleeps",
            baseline_value=baseline.count / baseline.total_s,
            extra={
                "latency_ms": latency.summary_ms(),
                "baseline_latency_ms": baseline.summary_ms(),
                "s3_requests_per_gib": storage.counter.per_gib(written),
            },
        ),
        Result(
            workload="fake",
            metric="p99 put latency",
            value=latency.percentile_s(0.99) * 1000,
            unit="ms",
            baseline="1 ms sleep p99",
            baseline_value=baseline.percentile_s(0.99) * 1000,
            higher_is_better=False,
        ),
    ]


async def broken_workload(ctx: Context) -> list[Result]:
    raise RuntimeError("this workload always fails")


def test_harness_runs_a_fake_workload_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "out"
    status = harness.main(
        [
            "fake",
            "--quick",
            "--target",
            "local",
            "--out",
            str(out),
            "--no-live",
            "--seed",
            "7",
            "--param",
            "a=1",
        ],
        workloads={"fake": fake_workload},
    )
    assert status == 0

    document = json.loads((out / "results.json").read_text())
    assert document["schema"] == SCHEMA
    assert document["machine"]["cpu_count"] >= 1
    assert document["machine"]["memory_bytes"] > 0
    for key in ("cpu_model", "python", "kernel", "disk", "event_loop"):
        assert document["machine"][key], key
    assert document["parameters"]["quick"] is True
    assert document["parameters"]["seed"] == 7
    assert document["parameters"]["params"] == {"a": "1"}
    assert document["parameters"]["target"] == {"kind": "local"}
    fake = document["workloads"]["fake"]
    assert fake["status"] == "ok"
    assert fake["cpu_s"] >= 0
    assert fake["peak_rss_bytes"] > 0
    assert fake["result_count"] == 2
    results = document["results"]
    assert [result["metric"] for result in results] == ["put throughput", "p99 put latency"]
    for result in results:
        assert set(result) == RESULT_KEYS
        assert result["ratio"] == pytest.approx(result["value"] / result["baseline_value"])
    assert results[0]["extra"]["latency_ms"]["count"] == 20
    assert results[0]["extra"]["s3_requests_per_gib"]["PUT"] == pytest.approx(20 * 1024**3 / (20 * 4096))

    summary = (out / "summary.md").read_text()
    assert "| fake | put throughput |" in summary
    assert "1 ms sleeps" in summary
    assert "(lower is better)" in summary
    for plot in ("fake-throughput.png", "fake-latency.png"):
        data = (out / "plots" / plot).read_bytes()
        assert data.startswith(b"\x89PNG"), plot
        assert f"plots/{plot}" in summary


def test_a_failing_workload_is_reported_and_the_others_still_run(tmp_path: Path) -> None:
    json_path = tmp_path / "custom.json"
    status = harness.main(
        [
            "broken",
            "fake",
            "nope",
            "--quick",
            "--target",
            "local",
            "--out",
            str(tmp_path / "o"),
            "--json",
            str(json_path),
            "--no-live",
            "--no-plots",
        ],
        workloads={"fake": fake_workload, "broken": broken_workload},
    )
    assert status == 1
    document = json.loads(json_path.read_text())
    assert document["workloads"]["broken"]["status"] == "error"
    assert "this workload always fails" in document["workloads"]["broken"]["error"]
    assert document["workloads"]["nope"]["status"] == "missing"
    assert document["workloads"]["fake"]["status"] == "ok"
    assert len(document["results"]) == 2
    assert "## Failures" in (tmp_path / "o" / "summary.md").read_text()


def test_all_selects_every_workload_once_in_order() -> None:
    assert harness.select_workloads(["all"], ["a", "b"]) == ["a", "b"]
    assert harness.select_workloads(["b", "all"], ["a", "b"]) == ["b", "a"]


def test_no_workload_named_is_a_usage_error(tmp_path: Path) -> None:
    assert harness.main(["--target", "local", "--out", str(tmp_path)], workloads={"fake": fake_workload}) == 2


def test_discovered_workloads_come_in_the_documented_order() -> None:
    found = list(harness.discover_workloads())
    assert "peers" in found
    known = [name for name in found if name in harness.WORKLOAD_ORDER]
    assert known == [name for name in harness.WORKLOAD_ORDER if name in found]
    assert found[: len(known)] == known


def _args(**flags: str | None) -> argparse.Namespace:
    base: dict[str, str | None] = dict.fromkeys(("endpoint", "access_key", "secret_key", "bucket", "region"))
    base.update(flags)
    return argparse.Namespace(**base)


def test_target_flags_win_over_bench_env_over_test_env() -> None:
    environ = {
        "S3STREAM_TEST_S3_ENDPOINT": "http://test:1",
        "S3STREAM_TEST_S3_ACCESS_KEY": "tk",
        "S3STREAM_TEST_S3_SECRET_KEY": "ts",
        "S3STREAM_TEST_S3_BUCKET": "tb",
        "S3STREAM_BENCH_S3_ENDPOINT": "http://bench:2",
    }
    target = harness.s3_target_from(_args(), environ)
    assert target is not None
    assert (target.endpoint, target.access_key, target.bucket) == ("http://bench:2", "tk", "tb")
    target = harness.s3_target_from(_args(endpoint="http://flag:3", bucket="fb"), environ)
    assert target is not None
    assert (target.endpoint, target.bucket, target.region) == ("http://flag:3", "fb", "us-east-1")
    assert "secret" not in str(target.public())
    assert harness.s3_target_from(_args(), {}) is None


def test_an_endpoint_without_keys_is_a_usage_error() -> None:
    with pytest.raises(harness.UsageError, match="no keys"):
        harness.s3_target_from(_args(endpoint="http://x:1"), {})


# --- measurement helpers ---------------------------------------------------------------------------


def test_latency_percentiles_by_nearest_rank() -> None:
    recorder = LatencyRecorder()
    recorder.extend([i / 1000 for i in range(1, 1001)])
    summary = recorder.summary_ms()
    assert summary["count"] == 1000
    assert summary["p50"] == pytest.approx(500)
    assert summary["p99"] == pytest.approx(990)
    assert summary["p999"] == pytest.approx(999)
    assert summary["max"] == pytest.approx(1000)
    assert math.isnan(LatencyRecorder().percentile_s(0.5))


def test_latency_reservoir_stays_bounded_and_representative() -> None:
    recorder = LatencyRecorder(samples_max=2000)
    for i in range(100_000):
        recorder.record((i * 7919 % 100_000) / 100_000)
    assert recorder.count == 100_000
    assert len(recorder._samples) == 2000
    assert recorder.percentile_s(0.5) == pytest.approx(0.5, abs=0.05)


def test_latency_samples_give_the_garbage_collector_nothing_to_walk() -> None:
    recorder = LatencyRecorder()
    for i in range(10_000):
        recorder.record(i / 1e6)
    assert len(gc.get_referents(recorder._samples)) <= 1  # an array's type at most, no float objects


def test_resource_meter_sees_cpu_time_and_memory() -> None:
    with ResourceMeter(interval_s=0.01) as before:
        pass
    with ResourceMeter(interval_s=0.01) as meter:
        block = bytearray(64 * MIB)  # zero-filled: every page is touched
        sum(range(300_000))
    del block
    assert meter.usage.cpu_s > 0
    assert meter.usage.peak_rss_bytes >= before.usage.peak_rss_bytes + 60 * MIB
    assert meter.usage.wall_s > 0


async def test_counting_storage_counts_requests_by_class() -> None:
    storage = CountingStorage(MemoryObjectStorage())
    await storage.put("a", b"12345678")
    upload = storage.upload("b")
    await upload.write(b"xy")
    await upload.complete()
    assert await storage.get("a", 2, 4) == b"34"
    await storage.head("a")
    assert [info.key async for info in storage.list("")] == ["a", "b"]
    await storage.delete(["a", "b"])
    snapshot = storage.counter.snapshot()
    assert snapshot["by_class"] == {
        "PUT": 2,
        "GET": 1,
        "COPY": 0,
        "DELETE": 1,
        "LIST": 1,
        "HEAD": 1,
        "OTHER": 0,
    }
    assert snapshot["bytes_written"] == 10
    assert snapshot["bytes_read"] == 2
    assert storage.counter.per_gib(1024**3)["PUT"] == 2


def test_request_counter_botocore_hook_maps_operations_to_classes() -> None:
    counter = RequestCounter()
    for operation in (
        "PutObject",
        "UploadPart",
        "UploadPartCopy",
        "GetObject",
        "DeleteObjects",
        "ListObjectsV2",
    ):
        counter._on_before_send(event_name=f"before-send.s3.{operation}", request=None)
    assert counter.snapshot()["by_class"] == {
        "PUT": 2,
        "GET": 1,
        "COPY": 1,
        "DELETE": 1,
        "LIST": 1,
        "HEAD": 0,
        "OTHER": 0,
    }
    assert per_gib(3, 1024**3 // 2) == 6


def test_odirect_write_writes_and_removes_its_file(tmp_path: Path) -> None:
    measured = odirect_write_sync(tmp_path / "f", total_bytes=4 * MIB + 1, block_bytes=MIB)
    assert measured.payload_bytes == 5 * MIB
    assert measured.op_count == 5
    assert measured.latency.count == 5
    assert measured.mb_per_s > 0
    assert not (tmp_path / "f").exists()


async def test_naive_writer_puts_one_object_per_stream_per_flush() -> None:
    storage = MemoryObjectStorage()
    spec = DurableWriteSpec(
        stream_count=4, producer_count=8, flush_interval_ms=20, warmup_s=0.05, duration_s=0.3
    )
    measured = await naive_writer(storage, spec)
    assert measured.op_count > 0
    keys = [info.key async for info in storage.list("naive/")]
    streams = {key.split("/")[1] for key in keys}
    assert streams == {f"{i:04d}" for i in range(4)}
    # Every object holds whole records of one stream; with 2 producers per stream and one flush
    # per interval, objects hold at most 2 records.
    for key in keys:
        size = len(await storage.get(key))
        assert size % spec.record_bytes == 0
        assert size <= 2 * spec.record_bytes
    assert measured.latency.summary_ms()["p50"] >= 0


# --- against a real S3 server (the baselines and the harness's request hook) -----------------------
# Marked integration: they run only with S3STREAM_TEST_S3_* set (CI: the project's Ceph RGW).


@pytest.mark.integration
async def test_raw_put_get_and_slatedb_baselines_on_a_real_server(
    s3_server: S3TestServer, s3_prefix: str
) -> None:
    target = s3_server.bench_target()
    put, got = await raw_s3_put_get(
        target, prefix=s3_prefix, object_count=3, object_bytes=256 * 1024, concurrency=2
    )
    assert got is not None
    assert put.requests is not None
    assert got.requests is not None
    assert put.requests.snapshot()["by_class"]["PUT"] == 3
    assert got.requests.snapshot()["by_class"]["GET"] == 3
    assert got.requests.bytes_read == put.requests.bytes_written == 3 * 256 * 1024
    assert put.latency.count == got.latency.count == 3

    spec = DurableWriteSpec(
        stream_count=2, producer_count=4, flush_interval_ms=50, warmup_s=0.1, duration_s=0.6
    )
    slate = await slatedb_writer(spec, target=target, prefix=s3_prefix + "slate/")
    assert slate.op_count > 0
    assert slate.requests is not None
    assert slate.requests.snapshot()["by_class"]["PUT"] > 0


async def s3_workload(ctx: Context) -> list[Result]:
    storage = ctx.open_storage("s3-fake")
    try:
        for index in range(3):
            await storage.put(f"o{index}", b"y" * 1000)
        assert len(await storage.get("o1")) == 1000
        await storage.delete(["o0", "o1"])  # o2 is left for the harness to clean up
    finally:
        await storage.close()
    return [Result(workload="s3fake", metric="m", value=1.0, unit="ops/s", baseline="b", baseline_value=2.0)]


async def finds_the_last_workloads_objects_gone(ctx: Context) -> list[Result]:
    storage = ctx.open_storage("s3-fake")
    try:
        with pytest.raises(NotFoundError):
            await storage.get("o2")
    finally:
        await storage.close()
    return []


@pytest.mark.integration
def test_harness_counts_the_engine_s3_requests_of_a_workload(s3_server: S3TestServer, tmp_path: Path) -> None:
    """... and deletes each workload's objects once it ends (a full run's would fill a RAM-backed server)."""
    flags = ["--target", "s3", "--endpoint", s3_server.endpoint, "--bucket", s3_server.bucket]
    flags += ["--access-key", s3_server.access_key, "--secret-key", s3_server.secret_key]
    status = harness.main(
        ["s3fake", "after", *flags, "--out", str(tmp_path), "--no-live", "--no-plots"],
        workloads={"s3fake": s3_workload, "after": finds_the_last_workloads_objects_gone},
    )
    assert status == 0
    document = json.loads((tmp_path / "results.json").read_text())
    assert document["parameters"]["target"]["endpoint"] == s3_server.endpoint
    assert s3_server.secret_key not in (tmp_path / "results.json").read_text()
    by_class = document["workloads"]["s3fake"]["s3_requests"]["by_class"]
    assert by_class["PUT"] >= 3
    assert by_class["GET"] >= 1
    assert by_class["DELETE"] >= 1
    assert document["results"][0]["ratio"] == 0.5
    run_id = document["parameters"]["run_id"]
    assert document["workloads"]["after"]["status"] == "ok", document["workloads"]["after"]["error"]
    assert f"deleted the run's 0 objects under bench/{run_id}/" in " ".join(document["notes"])


def test_a_zero_baseline_gives_a_null_ratio_and_strict_json(tmp_path: Path) -> None:
    async def zero_baseline(ctx: Context) -> list[Result]:
        return [
            Result(
                workload="z", metric="m | pipe", value=3.0, unit="MiB/s", baseline="none", baseline_value=0.0
            )
        ]

    status = harness.main(
        ["z", "--target", "local", "--out", str(tmp_path), "--no-live"], workloads={"z": zero_baseline}
    )
    assert status == 0
    text = (tmp_path / "results.json").read_text()
    assert "NaN" not in text
    assert json.loads(text)["results"][0]["ratio"] is None
    assert "| z | m \\| pipe | 3.00 | MiB/s | none | 0 | - |" in (tmp_path / "summary.md").read_text()


def test_the_secret_key_never_reaches_the_results() -> None:
    assert harness.redact_argv(["a", "--secret-key", "s3cr3t", "--secret-key=x"]) == [
        "a",
        "--secret-key",
        "***",
        "--secret-key=***",
    ]


def test_resource_meter_counts_the_cpu_of_child_processes() -> None:
    import subprocess
    import sys

    with ResourceMeter(interval_s=0.02) as meter:
        subprocess.run(
            [
                sys.executable,
                "-c",
                "import time\nend = time.process_time() + 0.4\nwhile time.process_time() < end: pass",
            ],
            check=True,
        )
    assert meter.usage.cpu_s >= 0.35


def test_process_tree_sample_reads_proc_and_agrees_with_psutil(monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    import signal
    import subprocess
    import sys

    from benchmarks import measure

    grandchild = (
        "import time\nblock = bytearray(40 << 20)\nend = time.process_time() + 0.3\n"
        "while time.process_time() < end: pass\nprint('ready', flush=True)\ntime.sleep(30)"
    )
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {grandchild!r}])",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "ready\n"
        own = measure._proc_rss_bytes("self")
        seen: dict[int, float] = {}
        seen_by_psutil: dict[int, float] = {}
        read: list[str] = []
        read_text = Path.read_text
        monkeypatch.setattr(
            Path, "read_text", lambda path, *a, **k: read.append(str(path)) or read_text(path, *a, **k)
        )
        total = measure._sample_process_tree(seen)
        (grandchild_pid,) = measure._proc_child_pids(str(child.pid))
        monkeypatch.undo()
        total_by_psutil = measure._sample_process_tree_psutil(seen_by_psutil)
    finally:
        for pid in measure._proc_child_pids(str(child.pid)):
            os.kill(pid, signal.SIGKILL)
        child.kill()
        child.wait()
    assert set(seen) == set(seen_by_psutil)  # every descendant (a test session may have others, e.g. a JVM)
    assert child.pid in seen
    assert grandchild_pid in seen
    assert total >= own + 40 * MIB
    assert abs(total - total_by_psutil) < max(8 * MIB, total // 20)  # (two samples, moments apart)
    assert seen[grandchild_pid] >= 0.25  # its CPU seconds, from its stat
    tree = {"self", *map(str, seen)}
    assert {path.split("/")[2] for path in read} == tree  # no other process's files: no scan of /proc


async def test_ingest_latency_rate_param_runs_the_latency_section_alone(tmp_path: Path) -> None:
    from benchmarks.workloads import ingest

    ctx = Context(
        quick=True,
        work_dir=tmp_path,
        s3=None,
        params={"latency_rate": "200", "latency_s": "0.5", "streams": "10"},
    )
    results = await ingest.run(ctx)
    assert [r.metric for r in results] == [
        "append p99 latency at half max rate (1 KiB records, uploads running)"
    ]
    extra = results[0].extra
    assert extra["rate_per_s"] == 200
    assert extra["engine_latency_ms"]["count"] == 100  # 0.5 s at 200/s, after the unrecorded warm-up


def test_ingest_gc_pauses_count_full_collections_in_wall_and_cpu_time() -> None:
    from benchmarks.workloads.ingest import GcPauses

    garbage = [[i] for i in range(50_000)]
    with GcPauses() as pauses:
        gc.collect(1)  # a young collection is not counted
        gc.collect()
    del garbage
    summary = pauses.summary_ms()
    assert summary["count"] == 1
    assert 0 < summary["cpu_total"] == summary["cpu_max"]
    assert 0 < summary["total"] == summary["max"]


def test_each_run_works_in_a_fresh_directory_under_work_dir_removed_at_its_end(tmp_path: Path) -> None:
    seen: list[Path] = []

    async def leaves_files(ctx: Context) -> list[Result]:
        assert not any(ctx.work_dir.iterdir()), "nothing of an earlier run is in the way"
        (ctx.work_dir / "wal").write_bytes(b"x" * 4096)
        seen.append(ctx.work_dir)
        return []

    work = tmp_path / "scratch"
    argv = ["w", "--target", "local", "--out", str(tmp_path / "o"), "--no-live", "--no-plots"]
    for _ in range(2):
        assert harness.main([*argv, "--work-dir", str(work)], workloads={"w": leaves_files}) == 0
    assert len(seen) == 2
    assert seen[0] != seen[1]
    assert all(work in path.parents for path in seen)
    assert list(work.iterdir()) == [], "each run's directory is removed"


async def replaces_the_sigint_handler(ctx: Context) -> list[Result]:
    """Like a workload that starts Spark: pyspark installs a SIGINT handler of its own."""
    signal.signal(signal.SIGINT, lambda signum, frame: None)
    return []


async def is_stopped_by_ctrl_c(ctx: Context) -> list[Result]:
    asyncio.get_running_loop().call_later(0.2, signal.raise_signal, signal.SIGINT)
    await asyncio.sleep(2)
    return []


async def must_not_run(ctx: Context) -> list[Result]:
    raise AssertionError("the run went on after Ctrl-C")


def test_ctrl_c_stops_the_run_after_a_workload_replaced_the_sigint_handler(tmp_path: Path) -> None:
    out = tmp_path / "out"
    # As at the command line (an earlier test may have left pyspark's handler in this process; asyncio
    # installs its own only over Python's default one).
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        status = harness.main(
            [
                "spark-like",
                "stopped",
                "after",
                "--target",
                "local",
                "--out",
                str(out),
                "--no-live",
                "--no-plots",
            ],
            workloads={
                "spark-like": replaces_the_sigint_handler,
                "stopped": is_stopped_by_ctrl_c,
                "after": must_not_run,
            },
        )
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, before if before is not None else signal.default_int_handler)
    assert status == 1
    workloads = json.loads((out / "results.json").read_text())["workloads"]
    assert workloads["spark-like"]["status"] == "ok"
    assert workloads["stopped"]["status"] == "interrupted"
    assert workloads["after"]["status"] == "interrupted"


async def times_out_inside(ctx: Context) -> list[Result]:
    async with asyncio.timeout(0.01):
        await asyncio.sleep(5)
    return []


def test_a_timeout_inside_a_workload_is_reported_with_its_traceback(tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = ["inner", "--target", "local", "--out", str(out), "--no-live", "--no-plots", "--timeout", "600"]
    assert harness.main(argv, workloads={"inner": times_out_inside}) == 1
    error = json.loads((out / "results.json").read_text())["workloads"]["inner"]["error"]
    assert "times_out_inside" in error
    assert "timed out after 600 s" not in error
