"""``python -m benchmarks --profile``: py-spy samples of each workload, summarized by frame and layer.

The summaries are checked on hand-written folded stacks; the sampler and the harness flag with the
real py-spy on a real process burning CPU in a function of a known name.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from benchmarks import harness
from benchmarks.core import Context, Result
from benchmarks.profiling import (
    ProfileError,
    Sampler,
    find_py_spy,
    frame_key,
    layer_of,
    main,
    parse_folded,
    summarize,
)

FOLDED = [
    'process 7:"python -m benchmarks";run (benchmarks/harness.py:10);_encode (benchmarks/workloads/format.py:5);'
    "write (s3stream/objectformat/writer.py:100) 30\n",
    'process 7:"python -m benchmarks";run (benchmarks/harness.py:10);_encode (benchmarks/workloads/format.py:5) 10\n',
    'process 7:"python -m benchmarks";run (benchmarks/harness.py:10);_memcpy (benchmarks/workloads/format.py:50) 20\n',
    'process 7:"python -m benchmarks";_run (asyncio/events.py:78);append (s3stream/engine/append.py:9) 40\n',
    "garbage without a count\n",
]


def test_summary_counts_self_total_and_layers() -> None:
    stacks = parse_folded(FOLDED)
    profile = summarize(stacks, path="x.folded")
    assert profile.samples == 100
    assert dict(profile.self_frames) == {
        "append (s3stream/engine/append.py:9)": 40,
        "write (s3stream/objectformat/writer.py:100)": 30,
        "_memcpy (benchmarks/workloads/format.py:50)": 20,
        "_encode (benchmarks/workloads/format.py:5)": 10,
    }
    total = dict(profile.total_frames)
    assert total["run (benchmarks/harness.py:10)"] == 60
    assert total["_encode (benchmarks/workloads/format.py:5)"] == 40
    assert dict(profile.layers) == {"s3stream/engine": 40, "s3stream/objectformat": 30, "benchmarks": 30}
    assert "| 40.0 % | 40 | `append (s3stream/engine/append.py:9)` |" in profile.to_markdown("x")


def test_under_matches_the_process_frames_of_children_too() -> None:
    child = (
        'process 7:"python -m benchmarks";process 9:"bash spark-submit";'
        'process 11:"python -m pyspark.daemon pyspark.worker";encode (spark_sink/encode.py:3) 12\n'
    )
    profile = summarize(parse_folded([*FOLDED, child]), path="x.folded", under="pyspark.daemon")
    assert profile.samples == 12
    assert dict(profile.self_frames) == {"encode (spark_sink/encode.py:3)": 12}


def test_under_keeps_only_the_stacks_through_a_frame() -> None:
    profile = summarize(parse_folded(FOLDED), path="x.folded", under="_encode")
    assert profile.samples == 40
    assert dict(profile.self_frames) == {
        "write (s3stream/objectformat/writer.py:100)": 30,
        "_encode (benchmarks/workloads/format.py:5)": 10,
    }


@pytest.mark.parametrize(
    ("frame", "layer"),
    [
        ("append (s3stream/engine/append.py:9)", "s3stream/engine"),
        ("f (s3stream/native.py:3)", "s3stream"),
        ("commit (wal/block_wal.py:4)", "wal"),
        ("_run (asyncio/events.py:78)", "asyncio"),
        ("_find_and_load (<frozen importlib._bootstrap>:1165)", "python (import machinery)"),
        ("crc32c_sse42 (libcrc32c.so)", "libcrc32c.so"),
        ("memcpy", "native"),
    ],
)
def test_layer_of(frame: str, layer: str) -> None:
    assert layer_of(frame) == layer


@pytest.mark.parametrize(
    ("frame", "key"),
    [
        ("append (s3stream/engine/append.py:9)", "append (s3stream/engine/append.py:9)"),
        ("_crc32c_hw_adler (crc32c_adler.c:261)", "_crc32c_hw_adler (crc32c_adler.c)"),
        ("0x7fafe3eb6109 (libc.so.6)", "? (libc.so.6)"),
        ("gc_collect_main (libpython3.11.so.1.0)", "gc_collect_main (libpython3.11.so.1.0)"),
        (
            "_find_and_load (<frozen importlib._bootstrap>:1165)",
            "_find_and_load (<frozen importlib._bootstrap>:1165)",
        ),
    ],
)
def test_native_frames_are_counted_by_function_not_line(frame: str, key: str) -> None:
    assert frame_key(frame) == key


def test_the_command_line_filters_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folded = tmp_path / "format.folded"
    folded.write_text("".join(FOLDED))
    assert main([str(folded), "--under", "_memcpy"]) == 0
    out = capsys.readouterr().out
    assert "20 samples" in out
    assert "_memcpy" in out
    assert "append" not in out
    assert main([str(folded), "--under", "nothing-like-this"]) == 1
    assert main([str(tmp_path / "missing.folded")]) == 2


BURNER = textwrap.dedent(
    """
    import sys, time

    def burn_the_cpu_here():
        deadline = time.monotonic() + float(sys.argv[1])
        n = 0
        while time.monotonic() < deadline:
            n += sum(range(1000))
        return n

    print("ready", flush=True)
    burn_the_cpu_here()
    """
)


def test_the_sampler_finds_the_function_a_real_process_burns_its_cpu_in(tmp_path: Path) -> None:
    script = tmp_path / "burner.py"
    script.write_text(BURNER)
    child = subprocess.Popen([sys.executable, str(script), "30"], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "ready\n"
        with Sampler(tmp_path / "burner.folded", pid=child.pid, rate_hz=200) as sampler:
            time.sleep(1.5)
        profile = sampler.profile()
    finally:
        child.kill()
        child.wait()
    assert profile.samples >= 50
    top_frame, top_samples = profile.self_frames[0]
    assert top_frame.startswith("burn_the_cpu_here ("), profile.self_frames
    assert top_samples >= 0.8 * profile.samples


async def cpu_workload(ctx: Context) -> list[Result]:
    deadline = time.monotonic() + 1.5
    n = 0
    while time.monotonic() < deadline:
        n += sum(range(1000))
    return [
        Result(workload="cpu", metric="loops", value=float(n), unit="n", baseline="none", baseline_value=1.0)
    ]


def test_the_harness_profiles_each_workload(tmp_path: Path) -> None:
    find_py_spy()  # the bench extra installs it: missing is a failure, not a skip
    out = tmp_path / "out"
    argv = ["cpu", "--target", "local", "--out", str(out), "--no-live", "--no-plots", "--profile"]
    assert harness.main([*argv, "--profile-rate", "200"], workloads={"cpu": cpu_workload}) == 0
    run = json.loads((out / "results.json").read_text())["workloads"]["cpu"]
    profile = run["profile"]
    assert profile["samples"] >= 50
    assert profile["self"][0][0].startswith("cpu_workload (")
    assert profile["path"] == str(out / "profiles" / "cpu.folded")
    assert (out / "profiles" / "cpu.folded").stat().st_size > 0
    assert "cpu_workload" in (out / "profiles" / "cpu.md").read_text()


def test_profile_flags_without_profile_are_usage_errors(tmp_path: Path) -> None:
    out = tmp_path / "out"
    for extra in (["--profile-native"], ["--profile-children"], ["--profile-rate", "50"]):
        argv = ["cpu", "--target", "local", "--out", str(out), "--no-live", *extra]
        assert harness.main(argv, workloads={"cpu": cpu_workload}) == 2
    argv = ["cpu", "--target", "local", "--out", str(out), "--profile", "--profile-rate", "0"]
    assert harness.main(argv, workloads={"cpu": cpu_workload}) == 2
    assert not out.exists()


def test_with_children_the_processes_a_workload_starts_are_sampled_too(tmp_path: Path) -> None:
    script = tmp_path / "burner.py"
    script.write_text(BURNER)
    with Sampler(tmp_path / "children.folded", rate_hz=200, children=True) as sampler:
        child = subprocess.Popen([sys.executable, str(script), "1.5"], stdout=subprocess.PIPE, text=True)
        try:
            assert child.stdout is not None
            assert child.stdout.readline() == "ready\n"
            child.wait(timeout=30)
        finally:
            child.kill()
            child.wait()
    frames = dict(sampler.profile().self_frames)
    assert any(frame.startswith("burn_the_cpu_here (") and n >= 50 for frame, n in frames.items()), frames


def test_profile_without_py_spy_is_refused_before_anything_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def missing() -> str:
        raise ProfileError("--profile needs py-spy")

    monkeypatch.setattr(harness, "find_py_spy", missing)
    out = tmp_path / "out"
    argv = ["cpu", "--target", "ceph", "--out", str(out), "--no-live", "--profile"]
    assert harness.main(argv, workloads={"cpu": must_not_run}) == 2  # not even the Ceph RGW is started
    assert not out.exists()


async def must_not_run(ctx: Context) -> list[Result]:
    raise AssertionError("a workload ran although --profile could not be honoured")
