"""The benchmark runner behind ``python -m benchmarks``: target, workloads, live progress, outputs.

Resolves the target (an S3 endpoint from flags or S3STREAM_BENCH_S3_* / S3STREAM_TEST_S3_*, the
project's Ceph RGW started through ``scripts/ceph-rgw``, or the local filesystem store), runs the
named workloads one after another under a live rich display, measures each one's CPU time, peak RSS
and raw S3 requests, and writes the JSON results, the Markdown summary and the plots
(:mod:`benchmarks.report`). A workload that raises is recorded as failed and the rest still run; the
exit status is 1 if any failed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import importlib
import inspect
import os
import pkgutil
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks import report as report_mod
from benchmarks.baselines import delete_prefix
from benchmarks.core import Context, Result, S3Target
from benchmarks.measure import RequestCounter, ResourceMeter
from benchmarks.pinning import PinError, PinPlan, ceph_data_dir, ceph_pids, parse_pids, pinned
from benchmarks.profiling import RATE_HZ_DEFAULT, ProfileError, Sampler, find_py_spy, sampler_factory

REPO_ROOT = Path(__file__).resolve().parents[1]
CEPH_SCRIPT = REPO_ROOT / "scripts" / "ceph-rgw"
WORKLOAD_ORDER = ("format", "storage", "wal", "ingest", "read", "compaction", "spark", "peers")
"""``all`` runs the workloads that exist in this order (then any others, by name)."""
WORKLOAD_TIMEOUT_S_DEFAULT = 1800.0
CEPH_SCRIPT_TIMEOUT_S = 120.0
"""``scripts/ceph-rgw env`` and ``fill`` answer in seconds; this bounds a stuck monitor."""
CEPH_FILL_WARN_RATIO = 0.80
"""The local Ceph RGW's OSD fill from which the harness warns (a run writes gigabytes)."""
CEPH_FILL_FAIL_RATIO = 0.95
"""... and from which it refuses to run (Ceph's default full ratio: every write blocks)."""
GIB = 1 << 30
ENV_PREFIXES = ("S3STREAM_BENCH_S3_", "S3STREAM_TEST_S3_")
PIPE_WIDTH = 180
"""Console width when the output is not a terminal (log files, CI)."""

WorkloadFn = Callable[[Context], Awaitable[list[Result]]]


class UsageError(Exception):
    """Bad flags or an unusable target: printed without a traceback, exit status 2."""


# --- workloads -------------------------------------------------------------------------------------


def discover_workloads() -> dict[str, str]:
    """Workload names -> module names found in ``benchmarks/workloads/`` (not imported yet)."""
    import benchmarks.workloads as package

    found = {
        info.name: f"{package.__name__}.{info.name}"
        for info in pkgutil.iter_modules(package.__path__)
        if not info.name.startswith("_")
    }
    ordered = [name for name in WORKLOAD_ORDER if name in found]
    ordered += sorted(name for name in found if name not in WORKLOAD_ORDER)
    return {name: found[name] for name in ordered}


def load_workload(module_name: str) -> WorkloadFn:
    module = importlib.import_module(module_name)
    run = getattr(module, "run", None)
    if run is None or not inspect.iscoroutinefunction(run):
        raise TypeError(f"{module_name} has no `async def run(ctx) -> list[Result]`")
    fn: WorkloadFn = run
    return fn


def select_workloads(requested: Sequence[str], available: Sequence[str]) -> list[str]:
    names: list[str] = []
    for name in requested:
        for chosen in available if name == "all" else [name]:
            if chosen not in names:
                names.append(chosen)
    return names


# --- target ----------------------------------------------------------------------------------------


def _from_env(name: str, environ: Mapping[str, str]) -> str | None:
    for prefix in ENV_PREFIXES:
        value = environ.get(prefix + name)
        if value:
            return value
    return None


def s3_target_from(args: argparse.Namespace, environ: Mapping[str, str]) -> S3Target | None:
    """The S3 target from flags, else S3STREAM_BENCH_S3_*, else S3STREAM_TEST_S3_*; None if no endpoint."""
    endpoint = args.endpoint or _from_env("ENDPOINT", environ)
    if not endpoint:
        return None
    access_key = args.access_key or _from_env("ACCESS_KEY", environ)
    secret_key = args.secret_key or _from_env("SECRET_KEY", environ)
    if not access_key or not secret_key:
        raise UsageError(
            f"S3 endpoint {endpoint} given but no keys: pass --access-key/--secret-key or set "
            "S3STREAM_BENCH_S3_ACCESS_KEY/S3STREAM_BENCH_S3_SECRET_KEY"
        )
    bucket = args.bucket or _from_env("BUCKET", environ) or "s3stream-bench"
    region = args.region or _from_env("REGION", environ) or "us-east-1"
    return S3Target(
        endpoint=endpoint, access_key=access_key, secret_key=secret_key, bucket=bucket, region=region
    )


def _script_env(script: Path) -> dict[str, str]:
    """The variables ``<script> env`` prints (``export NAME=value`` lines)."""
    env_out = subprocess.run(
        [str(script), "env"], capture_output=True, text=True, check=True, timeout=CEPH_SCRIPT_TIMEOUT_S
    ).stdout
    environ: dict[str, str] = {}
    for line in env_out.splitlines():
        for word in line.removeprefix("export ").split():
            name, _, value = word.partition("=")
            environ[name] = value.strip("'\"")
    return environ


def start_ceph(log: Callable[[str], None]) -> S3Target:
    """``scripts/ceph-rgw start`` (idempotent), then the endpoint and keys from ``scripts/ceph-rgw env``."""
    if not CEPH_SCRIPT.exists():
        raise UsageError(f"{CEPH_SCRIPT} is missing: use --target s3 with an endpoint, or --target local")
    log("starting the local Ceph RGW (scripts/ceph-rgw start) ...")
    started = subprocess.run([str(CEPH_SCRIPT), "start"], capture_output=True, text=True, check=False)
    if started.returncode != 0:
        raise UsageError(f"scripts/ceph-rgw start failed:\n{started.stderr[-3000:]}")
    environ = _script_env(CEPH_SCRIPT)
    target = s3_target_from(
        argparse.Namespace(endpoint=None, access_key=None, secret_key=None, bucket=None, region=None),
        {key.replace("S3STREAM_TEST_S3_", "S3STREAM_BENCH_S3_"): value for key, value in environ.items()},
    )
    if target is None:
        raise UsageError(f"scripts/ceph-rgw env printed no endpoint:\n{environ}")
    return target


def is_project_ceph(target: S3Target, *, script: Path | None = None) -> bool:
    """Whether ``target`` is the project's own Ceph RGW (the endpoint ``scripts/ceph-rgw env`` prints)."""
    script = script or CEPH_SCRIPT
    if not script.exists():
        return False
    try:
        ours = _script_env(script).get("S3STREAM_TEST_S3_ENDPOINT", "")
    except (OSError, subprocess.SubprocessError):
        return False
    return bool(ours) and ours.rstrip("/") == target.endpoint.rstrip("/")


def pin_plan(
    args: argparse.Namespace, kind: str, target: S3Target | None, log: Callable[[str], None]
) -> tuple[PinPlan | None, list[str]]:
    """The ``--pin`` plan (None without ``--pin``) and notes for the report: the server's processes are
    the project's Ceph RGW daemons when the target is that server, plus ``--server-pid``."""
    if not args.pin:
        if args.server_pid or args.pin_cpu is not None:
            raise UsageError("--server-pid and --pin-cpu need --pin")
        return None, []
    notes: list[str] = []
    servers = {pid: "--server-pid" for pid in parse_pids(args.server_pid or "")}
    if target is not None and (kind == "ceph" or is_project_ceph(target)):
        servers.update(ceph_pids(ceph_data_dir(REPO_ROOT)))
    elif not servers:
        notes.append(
            "--pin: the benchmark is pinned but no server process is (the target is not the project's "
            "Ceph RGW and no --server-pid was given)"
        )
    plan = PinPlan.make(bench_cpu=0 if args.pin_cpu is None else args.pin_cpu, server_pids=servers)
    log(
        f"pinning: benchmark on CPU {plan.bench_cpu}; server processes "
        f"{', '.join(f'{name} ({pid})' for pid, name in sorted(servers.items())) or '(none)'} "
        f"on CPUs {plan.server_cpus}"
    )
    return plan, notes


def check_ceph_fill(
    target: S3Target, log: Callable[[str], None], *, script: Path | None = None
) -> str | None:
    """If ``target`` is the project's own Ceph RGW (the endpoint ``scripts/ceph-rgw env`` prints), read
    its OSD's fill (``scripts/ceph-rgw fill``): a full OSD does not fail requests, every write just
    waits until the client times out. Warns loudly from :data:`CEPH_FILL_WARN_RATIO` and raises
    :class:`UsageError` from :data:`CEPH_FILL_FAIL_RATIO` (or Ceph's own full ratio, if lower).
    Returns a note for the report, or None when the target is not that RGW (a remote endpoint has no
    such check) or its OSD is comfortably empty. ``script`` stands in for scripts/ceph-rgw in tests."""
    script = script or CEPH_SCRIPT
    if not is_project_ceph(target, script=script):
        return None
    try:
        done = subprocess.run(
            [str(script), "fill"], capture_output=True, text=True, check=False, timeout=CEPH_SCRIPT_TIMEOUT_S
        )
        fill = dict(line.split("=", 1) for line in done.stdout.split() if "=" in line)
        ratio, full_ratio = float(fill["osd_fill_ratio"]), float(fill["full_ratio"])
        used, avail = int(fill["osd_used_bytes"]), int(fill["osd_avail_bytes"])
    except (OSError, subprocess.SubprocessError, KeyError, ValueError):
        note = "could not read the fill of the local Ceph RGW's OSD (scripts/ceph-rgw status tells more)"
        log(f"warning: {note}")
        return note
    state = (
        f"the local Ceph RGW's OSD is {ratio:.1%} full (raw used {used / GIB:.1f} GiB, available "
        f"{avail / GIB:.1f} GiB; Ceph stops writing at {full_ratio:.0%})"
    )
    advice = (
        "At that point every PUT waits until it times out. Deleted objects' space comes back a minute "
        "or two after the delete; objects left by earlier runs stay (scripts/ceph-rgw status, "
        "scripts/ceph-rgw reset wipes the cluster)."
    )
    if ratio >= min(CEPH_FILL_FAIL_RATIO, full_ratio):
        raise UsageError(f"{state}: refusing to run. {advice}")
    if ratio < CEPH_FILL_WARN_RATIO:
        return None
    rule = "!" * 78
    log(f"{rule}\nWARNING: {state}.\n{advice}\n{rule}")
    return f"{state} when the run started"


async def ensure_bucket(target: S3Target) -> None:
    """Reach the endpoint (typed error if it cannot be reached) and create the bucket if it is missing."""
    import botocore.exceptions

    from benchmarks.baselines import raw_s3_client

    try:
        async with raw_s3_client(target) as client:
            try:
                await client.head_bucket(Bucket=target.bucket)
            except botocore.exceptions.ClientError as exc:
                code = str(exc.response.get("Error", {}).get("Code", ""))
                if code not in ("404", "NoSuchBucket", "NotFound"):
                    raise
                await client.create_bucket(Bucket=target.bucket)
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError, OSError) as exc:
        raise UsageError(f"cannot use bucket {target.bucket} at {target.endpoint}: {exc}") from exc


# --- machine ---------------------------------------------------------------------------------------


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _memory_bytes() -> int:
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return 0


def _disk(path: Path) -> dict[str, Any]:
    info: dict[str, Any] = {"path": str(path)}
    usage = shutil.disk_usage(path)
    info.update(total_bytes=usage.total, free_bytes=usage.free)
    best = ""
    with contextlib.suppress(OSError):
        resolved = str(path.resolve())
        for line in Path("/proc/mounts").read_text().splitlines():
            device, mount_point, fs_type = line.split()[:3]
            if (resolved == mount_point or resolved.startswith(mount_point.rstrip("/") + "/")) and len(
                mount_point
            ) >= len(best):
                best = mount_point
                info.update(device=device, mount_point=mount_point, fs_type=fs_type)
    device_name = Path(str(info.get("device", ""))).name
    rotational = Path(f"/sys/block/{device_name}/queue/rotational")
    with contextlib.suppress(OSError, ValueError):
        info["rotational"] = rotational.read_text().strip() == "1"
    return info


def _package_versions() -> dict[str, str]:
    from importlib import metadata

    versions: dict[str, str] = {}
    for name in ("s3stream", "aiobotocore", "botocore", "aiohttp", "uvloop", "slatedb", "pyspark", "crc32c"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[name] = metadata.version(name)
    return versions


def _git_commit() -> str:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=False
        )
        if done.returncode == 0:
            return done.stdout.strip()
    return ""


def _git_dirty() -> bool | None:
    """Whether the working tree differs from ``git_commit`` (None outside a git checkout)."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode == 0:
            return bool(done.stdout.strip())
    return None


def machine_info(work_dir: Path) -> dict[str, Any]:
    from s3stream._loop import uvloop_available

    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "memory_bytes": _memory_bytes(),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "kernel": platform.release(),
        "platform": platform.platform(),
        "event_loop": "uvloop" if uvloop_available() else "asyncio",
        "disk": _disk(work_dir),
        "packages": _package_versions(),
        "git_commit": _git_commit(),
        "git_dirty": _git_dirty(),
    }


# --- running ---------------------------------------------------------------------------------------


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


async def run_one(
    name: str,
    workload: WorkloadFn,
    ctx: Context,
    *,
    timeout_s: float,
    sampler: Callable[[str], Sampler] | None = None,
) -> report_mod.WorkloadRun:
    """Run one workload, measuring its CPU, peak RSS and raw S3 requests; never raises for its failures.

    ``sampler`` (``--profile``): a py-spy sampler for the workload's name, run around the workload; its
    summary goes to ``run.profile`` and beside its folded stacks as Markdown."""
    run = report_mod.WorkloadRun(name=name)
    counter = RequestCounter()
    sigint = signal.getsignal(signal.SIGINT)
    started = time.perf_counter()
    spy: Sampler | None = None
    with contextlib.ExitStack() as stack, ResourceMeter() as meter, counter.count_aiobotocore():
        try:
            spy = stack.enter_context(sampler(name)) if sampler is not None else None
            results = await asyncio.wait_for(workload(ctx), timeout=timeout_s)
            if not isinstance(results, list) or not all(isinstance(result, Result) for result in results):
                raise TypeError(f"workload {name} returned {type(results).__name__}, not list[Result]")
            run.results = results
        except TimeoutError:
            if time.perf_counter() - started >= timeout_s:
                run.status, run.error = "error", f"timed out after {timeout_s:.0f} s"
            else:  # a timeout inside the workload, not the harness's
                run.status, run.error = "error", traceback.format_exc()
        except Exception:
            run.status, run.error = "error", traceback.format_exc()
        if _interrupted():
            run.status, run.error = (
                "interrupted",
                "interrupted (Ctrl-C)" + (f"; it raised: {run.error}" if run.error else ""),
            )
        stack.close()  # stops the sampler: py-spy writes its samples
        if signal.getsignal(signal.SIGINT) is not sigint:
            # A workload that started Spark leaves pyspark's SIGINT handler behind; Ctrl-C must
            # reach the run's own handler again (asyncio's: it cancels the run).
            signal.signal(signal.SIGINT, sigint)
    if spy is not None:
        try:
            profile = spy.profile()
        except ProfileError as exc:
            run.profile = {"error": str(exc)}
        else:
            run.profile = profile.to_json()
            spy.output.with_suffix(".md").write_text(profile.to_markdown(name), encoding="utf-8")
    run.duration_s = time.perf_counter() - started
    run.cpu_s, run.cpu_util, run.peak_rss_bytes = (
        meter.usage.cpu_s,
        meter.usage.cpu_util,
        meter.usage.peak_rss_bytes,
    )
    run.s3_requests = counter.snapshot()
    moved_bytes = run.s3_requests["bytes_written"] + run.s3_requests["bytes_read"]
    run.s3_requests["per_gib_moved"] = counter.per_gib(moved_bytes) if moved_bytes else {}
    for result in run.results:
        result.workload = result.workload or name
    return run


class _Display:
    """The live progress display: one row per workload with its state, status line and elapsed time."""

    def __init__(self, names: Sequence[str], enabled: bool) -> None:
        from rich.console import Console
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.console = Console(stderr=True, width=None if sys.stderr.isatty() else PIPE_WIDTH)
        self.progress = Progress(
            SpinnerColumn(finished_text="[green]done[/]"),
            TextColumn("[bold]{task.fields[workload]:<12}"),
            TimeElapsedColumn(),
            TextColumn("{task.description}"),
            console=self.console,
            disable=not enabled,
            transient=False,
        )
        self.tasks = {
            name: self.progress.add_task("waiting", workload=name, total=1, start=False) for name in names
        }

    def __enter__(self) -> _Display:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(None, None, None)

    def begin(self, name: str) -> Callable[[str], None]:
        task = self.tasks[name]
        self.progress.start_task(task)
        self.progress.update(task, description="running")

        def status(text: str) -> None:
            self.progress.update(task, description=text[:100])

        return status

    def end(self, run: report_mod.WorkloadRun) -> None:
        task = self.tasks[run.name]
        summary = (
            f"[green]{len(run.results)} results[/]"
            if run.status == "ok"
            else f"[red]{run.status}: {(run.error.strip().splitlines() or [''])[-1][:80]}[/]"
        )
        self.progress.update(task, description=summary, completed=1)
        self.progress.stop_task(task)
        if self.progress.disable:
            self.console.print(
                f"{run.name}: {run.status} in {run.duration_s:.1f} s, {len(run.results)} results"
            )
        for result in run.results:
            self.progress.console.print(
                f"  {result.workload}: {result.metric} = {report_mod.fmt(result.value)} {result.unit} "
                f"vs {result.baseline} {report_mod.fmt(result.baseline_value)} -> {report_mod.ratio_text(result)}"
                + (
                    f"; CPU s/GiB {report_mod.cpu_text(result)}" if report_mod.cpu_text(result) != "-" else ""
                ),
                markup=False,
                soft_wrap=True,
                highlight=False,
            )


async def run_benchmarks(
    names: Sequence[str],
    workloads: Mapping[str, WorkloadFn | str],
    ctx_factory: Callable[[str, Callable[[str], None]], Context],
    *,
    timeout_s: float = WORKLOAD_TIMEOUT_S_DEFAULT,
    live: bool = True,
    runs: list[report_mod.WorkloadRun] | None = None,
    sampler: Callable[[str], Sampler] | None = None,
    after_each: Callable[[str], Awaitable[None]] | None = None,
) -> list[report_mod.WorkloadRun]:
    """Run ``names`` in order; ``workloads`` maps a name to its function or its module name.

    Finished runs are appended to ``runs`` (if given) as they end, so an interrupted run keeps them.
    ``after_each(name)`` runs after each workload (the harness deletes the workload's objects there)."""
    runs = runs if runs is not None else []
    with _Display(names, enabled=live) as display:
        for name in names:
            status = display.begin(name)
            entry = workloads.get(name)
            if entry is None:
                run = report_mod.WorkloadRun(
                    name=name,
                    status="missing",
                    error=f"no workload {name!r} (have: {', '.join(workloads) or 'none'})",
                )
            else:
                try:
                    fn = load_workload(entry) if isinstance(entry, str) else entry
                except Exception:
                    run = report_mod.WorkloadRun(name=name, status="error", error=traceback.format_exc())
                else:
                    run = await run_one(
                        name, fn, ctx_factory(name, status), timeout_s=timeout_s, sampler=sampler
                    )
            runs.append(run)
            display.end(run)
            if after_each is not None and not _interrupted():
                await after_each(name)
            if _interrupted():
                # Ctrl-C cancels the main task; a workload that turned the cancellation into an
                # error of its own must not let the run go on with the next workload.
                raise asyncio.CancelledError
    return runs


def _interrupted() -> bool:
    """Whether this task has been asked to stop (Ctrl-C: ``asyncio.Runner`` cancels the main task)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        allow_abbrev=False,
        description="Run s3stream benchmark workloads against an S3 endpoint (default: the local Ceph RGW) "
        "or the local filesystem store; every figure comes with a baseline measured in the same run.",
    )
    parser.add_argument("workloads", nargs="*", help="workload names, or `all` (see --list)")
    parser.add_argument("--list", action="store_true", help="list the workloads and exit")
    parser.add_argument("--quick", action="store_true", help="small sizes: seconds per workload")
    parser.add_argument(
        "--target",
        choices=("auto", "ceph", "s3", "local"),
        default="auto",
        help="auto (default): an endpoint from flags or S3STREAM_BENCH_S3_* / S3STREAM_TEST_S3_* if set, "
        "else start the local Ceph RGW; ceph: always scripts/ceph-rgw; s3: the endpoint from flags or "
        "environment; local: the local filesystem store only",
    )
    parser.add_argument("--endpoint", help="S3 endpoint URL, e.g. http://127.0.0.1:9000 (MinIO)")
    parser.add_argument("--bucket", help="bucket (created if missing; default s3stream-bench)")
    parser.add_argument("--access-key", help="access key (or S3STREAM_BENCH_S3_ACCESS_KEY)")
    parser.add_argument("--secret-key", help="secret key (or S3STREAM_BENCH_S3_SECRET_KEY)")
    parser.add_argument("--region", help="region (default us-east-1)")
    parser.add_argument("--json", type=Path, help="results JSON path (default <out>/results.json)")
    parser.add_argument("--out", type=Path, help="output directory (default bench-results/<UTC time>)")
    parser.add_argument(
        "--work-dir",
        type=Path,
        help="where the run's scratch directory goes, on the disk under test: a fresh one per run, "
        "removed at the end (default: the system's temp dir)",
    )
    parser.add_argument(
        "--param", action="append", default=[], metavar="NAME=VALUE", help="workload parameter"
    )
    parser.add_argument("--seed", type=int, default=None, help="random seed passed to workloads")
    parser.add_argument(
        "--timeout", type=float, default=WORKLOAD_TIMEOUT_S_DEFAULT, help="seconds per workload"
    )
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.add_argument("--no-live", action="store_true", help="plain log lines instead of the live display")
    parser.add_argument(
        "--keep-objects", action="store_true", help="keep the objects the run wrote under bench/<run id>/"
    )
    parser.add_argument(
        "--metadata-url",
        "--pg-url",
        dest="metadata_url",
        help="the PostgreSQL server the `metadata` workload measures (postgresql://user:pass@host:port/db; "
        "it creates and drops schemas of its own there); default S3STREAM_TEST_PG_URL, else the project's "
        "server (scripts/postgres start)",
    )
    parser.add_argument(
        "--pin",
        action="store_true",
        help="a fair bench: this process (and its threads) on one CPU (--pin-cpu), the S3 server's processes "
        "on the others (the project's Ceph RGW daemons when that is the target, and --server-pid); processes "
        "a workload pins itself go round robin over the CPUs this process had; affinities are restored at "
        "the end",
    )
    parser.add_argument(
        "--pin-cpu", type=int, default=None, metavar="N", help="with --pin: the benchmark's CPU (default 0)"
    )
    parser.add_argument(
        "--server-pid",
        metavar="PID[,PID...]",
        help="with --pin: the S3 server's processes to pin on the other CPUs (every thread of each)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="sample each workload with py-spy (without pausing the process): folded stacks and a summary "
        "(self, total, by layer) per workload under <out>/profiles/, the summary also in the results JSON",
    )
    parser.add_argument(
        "--profile-native",
        action="store_true",
        help="with --profile: C frames too (py-spy --native; pauses the process for each sample)",
    )
    parser.add_argument(
        "--profile-children",
        action="store_true",
        help="with --profile: the processes a workload starts too (node processes, Spark's Python workers); "
        "py-spy then keeps scanning for them, ~0.4 of a CPU on the server's side",
    )
    parser.add_argument(
        "--profile-rate",
        type=int,
        default=RATE_HZ_DEFAULT,
        metavar="HZ",
        help=f"with --profile: samples per second (default {RATE_HZ_DEFAULT})",
    )
    return parser


def redact_argv(argv: Sequence[str]) -> list[str]:
    """The command line with the values of ``--secret-key`` and ``--metadata-url`` hidden (it goes into
    result files; a metadata URL may hold a password)."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append("***")
            hide_next = False
        elif arg in ("--secret-key", "--metadata-url", "--pg-url"):
            out.append(arg)
            hide_next = True
        elif arg.startswith(("--secret-key=", "--metadata-url=", "--pg-url=")):
            out.append(arg.split("=", 1)[0] + "=***")
        else:
            out.append(arg)
    return out


def resolve_target(args: argparse.Namespace, log: Callable[[str], None]) -> tuple[str, S3Target | None]:
    if args.target == "local":
        return "local", None
    if args.target == "ceph":
        return "ceph", start_ceph(log)
    target = s3_target_from(args, os.environ)
    if target is not None:
        return "s3", target
    if args.target == "s3":
        raise UsageError("--target s3 needs --endpoint (or S3STREAM_BENCH_S3_ENDPOINT) and keys")
    return "ceph", start_ceph(log)


def main(
    argv: Sequence[str] | None = None, *, workloads: Mapping[str, WorkloadFn | str] | None = None
) -> int:
    """The command line; ``workloads`` replaces the discovered ones (tests pass fakes here)."""
    from s3stream._loop import run as run_loop

    args = build_parser().parse_args(argv)
    available: Mapping[str, WorkloadFn | str] = workloads if workloads is not None else discover_workloads()
    if args.list:
        print("\n".join(available) or "(no workloads)")
        return 0
    if not args.workloads:
        print("name at least one workload, or `all`; available: " + ", ".join(available), file=sys.stderr)
        return 2
    names = select_workloads(args.workloads, list(available))
    params: dict[str, Any] = {}
    for item in args.param:
        key, sep, value = item.partition("=")
        if not sep or not key:
            print(f"--param wants NAME=VALUE, got {item!r}", file=sys.stderr)
            return 2
        params[key] = value
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "big")
    out_dir: Path = args.out or REPO_ROOT / "bench-results" / datetime.datetime.now(datetime.UTC).strftime(
        "%Y%m%dT%H%M%SZ"
    )

    def log(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    try:
        py_spy = profile_tool(args)  # before any server is started
        kind, target = resolve_target(args, log)
        target_notes: list[str] = []
        if target is not None:
            fill_note = check_ceph_fill(target, log)
            target_notes += [fill_note] if fill_note else []
            run_loop(ensure_bucket(target))
        plan, pin_notes = pin_plan(args, kind, target, log)
        target_notes += pin_notes
    except (UsageError, PinError, ProfileError) as exc:
        log(f"error: {exc}")
        return 2
    log(
        f"target: {kind}"
        + (f" {target.endpoint} bucket {target.bucket}" if target else " (local filesystem store)")
        + f"; workloads: {', '.join(names)}; quick={args.quick}; seed={seed}"
    )

    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(pinned(plan))
        except PinError as exc:
            log(f"error: {exc}")
            return 2
        pinning = plan.to_json() if plan is not None else None
        # A fresh directory per run, removed at its end, also under --work-dir: a run that reused the
        # last one's WAL and metadata files measured something else, and a local object store left
        # there grew by gigabytes a run.
        if args.work_dir is not None:
            args.work_dir.mkdir(parents=True, exist_ok=True)
        work_root = Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="s3stream-bench-", dir=args.work_dir))
        )
        run_id = os.urandom(5).hex()
        notes: list[str] = list(target_notes)
        notes_by_ctx: list[tuple[str, Context]] = []

        def ctx_factory(name: str, status: Callable[[str], None]) -> Context:
            work_dir = work_root / name
            work_dir.mkdir(parents=True, exist_ok=True)
            ctx = Context(
                quick=args.quick,
                work_dir=work_dir,
                s3=target,
                notes=[],
                run_id=run_id,
                seed=seed,
                params=dict(params),
                status_sink=status,
                metadata_url=args.metadata_url,
                pin=args.pin,
                child_cpus=plan.child_cpus if plan is not None else None,
            )
            notes_by_ctx.append((name, ctx))
            return ctx

        async def delete_objects_after(name: str) -> None:
            # A full run wrote ~10 GiB; kept until its end they filled a RAM-backed server.
            assert target is not None
            prefix = f"bench/{run_id}/"
            try:
                await delete_prefix(target, prefix)
            except Exception as exc:
                notes.append(f"{name}: its objects under {prefix} were not deleted after it: {exc}")

        started_at, started = _now(), time.perf_counter()
        machine = machine_info(work_root)
        runs: list[report_mod.WorkloadRun] = []
        try:
            run_loop(
                run_benchmarks(
                    names,
                    available,
                    ctx_factory,
                    timeout_s=args.timeout,
                    live=not args.no_live and sys.stderr.isatty(),
                    runs=runs,
                    sampler=(
                        None
                        if py_spy is None
                        else sampler_factory(
                            out_dir / "profiles",
                            py_spy=py_spy,
                            native=args.profile_native,
                            children=args.profile_children,
                            rate_hz=args.profile_rate,
                            cpus=plan.server_cpus if plan is not None else None,
                        )
                    ),
                    after_each=delete_objects_after if target is not None and not args.keep_objects else None,
                )
            )
        except KeyboardInterrupt:
            done = {run.name for run in runs}
            runs += [
                report_mod.WorkloadRun(name=name, status="interrupted", error="interrupted (Ctrl-C)")
                for name in names
                if name not in done
            ]
            notes.append("the run was interrupted; results of the workloads that finished are kept")
        for name, ctx in notes_by_ctx:
            notes += [f"{name}: {note}" for note in ctx.notes]
        if target is not None and not args.keep_objects:
            notes.append(_clean_up(target, f"bench/{run_id}/", log))
        report = report_mod.Report(
            started_at=started_at,
            finished_at=_now(),
            duration_s=time.perf_counter() - started,
            machine=machine,
            parameters={
                "workloads": names,
                "quick": args.quick,
                "seed": seed,
                "run_id": run_id,
                "params": params,
                "target": {"kind": kind, **(target.public() if target else {})},
                "argv": redact_argv(list(argv) if argv is not None else sys.argv[1:]),
            },
            runs=runs,
            notes=notes,
            pinning=pinning,
        )
        written = report_mod.write_all(report, out_dir=out_dir, json_path=args.json, plots=not args.no_plots)
    _print_summary(report, written)
    return 0 if all(run.status == "ok" for run in runs) else 1


def profile_tool(args: argparse.Namespace) -> str | None:
    """py-spy's path under ``--profile`` (None without it); :class:`UsageError` for profile flags
    without ``--profile`` or a rate below 1, :class:`ProfileError` when py-spy is missing."""
    if not args.profile:
        if args.profile_native or args.profile_children or args.profile_rate != RATE_HZ_DEFAULT:
            raise UsageError("--profile-native, --profile-children and --profile-rate need --profile")
        return None
    if args.profile_rate < 1:
        raise UsageError(f"--profile-rate must be at least 1, got {args.profile_rate}")
    return find_py_spy()


def _clean_up(target: S3Target, prefix: str, log: Callable[[str], None]) -> str:
    from s3stream._loop import run as run_loop

    try:
        deleted = run_loop(delete_prefix(target, prefix))
    except Exception as exc:
        log(f"could not delete the run's objects under {prefix}: {exc}")
        return f"objects under {prefix} were not deleted: {exc}"
    return f"deleted the run's {deleted} objects under {prefix} (--keep-objects keeps them)"


def goal_table(report: report_mod.Report) -> Any:
    """The goal rows (:mod:`benchmarks.goals`) as a rich table: value, baseline, ratio, goal, status."""
    from rich.table import Table

    table = Table(title="goals (ratio = value / baseline, same run)")
    for column in ("goal", "value", "baseline", "ratio", "bound", "status", "note"):
        table.add_column(
            column,
            justify="right" if column in ("value", "baseline", "ratio") else "left",
            overflow="fold",
            max_width=44 if column in ("goal", "note") else None,
        )
    colour = {"met": "green", "not met": "red", "not run": "yellow"}
    for row in report.goals():
        table.add_row(
            row.row,
            f"{report_mod.fmt(row.value)} {row.unit}".strip(),
            report_mod.fmt(row.baseline),
            f"{report_mod.fmt(row.ratio)}x" if row.ratio is not None else "-",
            row.goal,
            f"[{colour[row.status]}]{row.status}[/]",
            row.note,
        )
    return table


def _print_summary(report: report_mod.Report, written: Mapping[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="s3stream benchmark results (ratio = value / baseline, same run)")
    widths = {"metric": 34, "baseline": 38}
    columns = ("workload", "metric", "value", "unit", "baseline", "baseline value", "ratio", "CPU s/GiB")
    for column in columns:
        table.add_column(
            column,
            justify="right" if column in ("value", "baseline value", "ratio", "CPU s/GiB") else "left",
            min_width=min(widths.get(column, 0), 24),
            max_width=widths.get(column),
            no_wrap=column not in widths,
            overflow="fold",
        )
    for result in report.results:
        table.add_row(
            result.workload,
            result.metric,
            report_mod.fmt(result.value),
            result.unit,
            result.baseline,
            report_mod.fmt(result.baseline_value),
            report_mod.ratio_text(result),
            report_mod.cpu_text(result),
        )
    console = Console(width=None if sys.stdout.isatty() else PIPE_WIDTH)
    console.print(table)
    console.print(goal_table(report))
    for run in report.runs:
        if run.status != "ok":
            console.print(f"[red]{run.name}: {run.status}[/]\n{run.error}", highlight=False)
    console.print(f"JSON: {written['json']}\nMarkdown: {written['markdown']}")
    for path in written["plots"]:
        console.print(f"plot: {path}")
