"""``--pin``: real affinities of real processes (this one and children it starts), and the typed errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks import harness, pinning
from benchmarks.core import Context, Result
from benchmarks.pinning import PinError, PinPlan, ceph_pids, parse_pids, pinned, thread_ids

THREADED_CHILD = """
import sys, threading, time
for _ in range(3):
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
print("ready", flush=True)
sys.stdin.read()
"""


@pytest.fixture(autouse=True)
def _private_lock(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A pinning lock of the test's own: a real ``--pin`` run on this machine must not fail it (an
    absolute LOCK_NAME replaces the temp directory it is joined to)."""
    monkeypatch.setattr(pinning, "LOCK_NAME", str(tmp_path / "pin.lock"))


@pytest.fixture
def server() -> Iterator[subprocess.Popen[str]]:
    """A stand-in server: a process with four threads that lives until its stdin closes."""
    process = subprocess.Popen(
        [sys.executable, "-c", THREADED_CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "ready"
    try:
        yield process
    finally:
        process.kill()
        process.wait()


def _masks(pid: int) -> set[frozenset[int]]:
    return {frozenset(os.sched_getaffinity(tid)) for tid in thread_ids(pid)}


def test_the_machine_has_two_cpus_to_split() -> None:
    assert len(os.sched_getaffinity(0)) >= 2, "the pinning tests need 2 CPUs"


def test_a_server_process_ends_on_the_other_cpu_every_thread_and_is_restored(
    server: subprocess.Popen[str],
) -> None:
    before = _masks(server.pid)
    plan = PinPlan.make(bench_cpu=0, server_pids={server.pid: "stand-in"})
    own_before = os.sched_getaffinity(0)
    with pinned(plan):
        assert len(thread_ids(server.pid)) == 4
        assert _masks(server.pid) == {frozenset(plan.server_cpus)}
        assert 0 not in plan.server_cpus
        assert os.sched_getaffinity(0) == {0}
        record = plan.to_json()
        assert record["servers"] == [{"pid": server.pid, "name": "stand-in", "cpus_now": plan.server_cpus}]
        assert record["bench_cpus_now"] == [0]
    assert _masks(server.pid) == before
    assert os.sched_getaffinity(0) == own_before


def test_pin_cpu_chooses_the_benchmark_cpu() -> None:
    cpus = sorted(os.sched_getaffinity(0))
    plan = PinPlan.make(bench_cpu=cpus[-1], server_pids={})
    with pinned(plan):
        assert os.sched_getaffinity(0) == {cpus[-1]}
        child = subprocess.run(
            [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
            capture_output=True,
            text=True,
            check=True,
        )
        assert json.loads(child.stdout) == [cpus[-1]]  # a process started meanwhile inherits it
    assert plan.server_cpus == cpus[:-1]


def test_an_unknown_pid_one_cpu_or_a_foreign_cpu_is_a_typed_error() -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with pytest.raises(PinError, match=f"no such process: PID {dead.pid}"):
        PinPlan.make(bench_cpu=0, server_pids={dead.pid: "gone"})
    with pytest.raises(PinError, match="at least 2 CPUs"):
        PinPlan.make(bench_cpu=0, server_pids={}, available_cpus=[0])
    with pytest.raises(PinError, match="--pin-cpu 7"):
        PinPlan.make(bench_cpu=7, server_pids={}, available_cpus=[0, 1])
    with pytest.raises(PinError, match="PID"):
        parse_pids("12,abc")
    assert parse_pids("12, 34") == [12, 34]


def test_ceph_pid_files_name_the_daemons_or_fail_clearly(tmp_path: Path) -> None:
    with pytest.raises(PinError, match="S3STREAM_CEPH_DIR"):
        ceph_pids(tmp_path)
    (tmp_path / "run").mkdir()
    for name in ("mon.a", "osd.0", "client.rgw.a"):
        (tmp_path / "run" / f"{name}.pid").write_text(f"{os.getpid()}\n")
    assert ceph_pids(tmp_path) == {os.getpid(): "client.rgw.a"}


def test_harness_pin_runs_workloads_pinned_records_and_restores(
    server: subprocess.Popen[str], tmp_path: Path
) -> None:
    seen: dict[str, object] = {}

    async def probe(ctx: Context) -> list[Result]:
        seen["bench"] = sorted(os.sched_getaffinity(0))
        seen["server"] = sorted(_masks(server.pid))
        seen["children"] = ctx.cpus_for_children()
        return [Result("probe", "x", 1.0, "MB/s", "y", 1.0)]

    own_before = os.sched_getaffinity(0)
    server_before = _masks(server.pid)
    out = tmp_path / "out"
    argv = ["probe", "--target", "local", "--out", str(out), "--no-live", "--no-plots"]
    status = harness.main([*argv, "--pin", "--server-pid", str(server.pid)], workloads={"probe": probe})
    assert status == 0
    cpus = sorted(own_before)
    assert seen == {"bench": [0], "server": [frozenset(cpus[1:])], "children": cpus}
    assert os.sched_getaffinity(0) == own_before
    assert _masks(server.pid) == server_before
    recorded = json.loads((out / "results.json").read_text())["pinning"]
    assert recorded["bench_cpu"] == 0
    assert recorded["server_cpus"] == cpus[1:]
    assert recorded["servers"][0]["pid"] == server.pid

    assert harness.main([*argv, "--server-pid", str(server.pid)], workloads={"probe": probe}) == 2
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert harness.main([*argv, "--pin", "--server-pid", str(dead.pid)], workloads={"probe": probe}) == 2
    assert os.sched_getaffinity(0) == own_before
    status = harness.main(argv, workloads={"probe": probe})  # without --pin nothing changes
    assert status == 0
    assert seen["bench"] == cpus
    assert json.loads((out / "results.json").read_text())["pinning"] is None


def test_a_second_run_may_not_pin_servers_while_one_does(
    server: subprocess.Popen[str], tmp_path: Path
) -> None:
    lock = tmp_path / "pin.lock"
    first = PinPlan.make(bench_cpu=0, server_pids={server.pid: "stand-in"})
    second = PinPlan.make(bench_cpu=0, server_pids={server.pid: "stand-in"})
    first.lock_path = second.lock_path = lock
    before = _masks(server.pid)
    own_before = os.sched_getaffinity(0)
    with pinned(first):
        with pytest.raises(PinError, match="another --pin run"):
            second.apply()
        assert _masks(server.pid) == {frozenset(first.server_cpus)}  # the refused run changed nothing
    assert _masks(server.pid) == before
    assert os.sched_getaffinity(0) == own_before
    with pinned(second):  # the lock is free again
        assert _masks(server.pid) == {frozenset(second.server_cpus)}
    assert _masks(server.pid) == before
