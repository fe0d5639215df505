"""Workload ``metadata``: the shared PostgreSQL metadata store against the embedded SQLite one.

Every figure is the PostgreSQL store (the server of ``--metadata-url``, else ``S3STREAM_TEST_PG_URL``,
else the project's ``scripts/postgres``; each measurement in a fresh schema of its own, dropped after)
next to the SQLite store (a fresh file in the scratch dir) measured in the same run, the two sides of
a pair run back to back in alternating order. ``--param subject=sqlite`` puts SQLite on both sides:
a check of the method (the ratios should come out near 1), and what the quick unit test runs.

1. **Commits per second**, 1 and 8 nodes (``--param nodes=1,8``): each node is a process of its own
   with its own node id (:mod:`benchmarks.workloads._metadata_node`), all on one store, each running
   one operation at a time for ``duration_s`` after ``warmup_s`` unrecorded: a StreamSet-object commit
   of ``streams`` (1,000) ranges (prepare + commit), a stream close or open, a KV put. The figure is
   the sum of the nodes' operations per second; the extras give the latency of one operation (all
   nodes), the nodes' client CPU per operation (the server's CPU is not counted: on this machine it
   shares the cores) and the retries (SQLite's write lock held beyond its 5 s busy timeout by the
   other processes).
2. **End-to-end 1 KiB ingest** (goal >= 0.9x): the engine (``open_client``) on the target's object
   store with the default Config, ``producers`` tasks appending 1 KiB records round-robin over
   ``ingest_streams`` streams, then the drain (every record uploaded and committed); only the
   ``metadata=`` store differs. The figure is ingest + drain MB/s (the commits are in it), the median
   of ``ingest_rounds`` alternating pairs; every round is in the extras.
3. **Reader catch-up from another process** (goal >= 0.7x), :mod:`benchmarks.workloads._metadata_reader`:
   an engine with the PostgreSQL store writes ``reader_mib`` MiB of 1 KiB records into one stream and
   uploads it; then a separate process reads the stream from its first offset to its end through a
   reader that has only the metadata URL and the object store (no data dir, no WAL), against the same
   bytes fetched with raw ranged GETs from the same process.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import statistics
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

from benchmarks.core import Context, Result
from benchmarks.measure import LatencyRecorder
from benchmarks.pgserver import REPO_ROOT, pg_schema, redacted, resolve_pg_url
from benchmarks.workloads import _metadata_reader as reader_side
from benchmarks.workloads._metadata_node import OPERATIONS, SPEC_ENV, NodeSpec, Operation, open_store
from s3stream.assembly import open_client
from s3stream.config import Config
from s3stream.model import RecordBatch
from s3stream.storage.s3 import S3ObjectStorage

W = "metadata"
KiB = 1 << 10
MiB = 1 << 20
Kind = Literal["sqlite", "postgresql"]
NODE_READY_TIMEOUT_S = 600.0
"""A node's untimed setup (1,000 streams created and opened) on a loaded machine."""
LABELS: dict[Operation, str] = {
    "streamset": "StreamSet-object commits/s ({streams} streams each: prepare + commit)",
    "openclose": "stream open/close ops/s",
    "kv": "KV puts/s",
}


class Sides:
    """Where each side's stores live: fresh SQLite files in the scratch dir, fresh PostgreSQL schemas."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.subject: Kind = "sqlite" if ctx.param("subject", "postgresql") == "sqlite" else "postgresql"
        self.pg_url = "" if self.subject == "sqlite" else resolve_pg_url(ctx.metadata_url, ctx.status)
        self.count = 0

    def label(self, kind: Kind) -> str:
        return "SQLite" if kind == "sqlite" else "PostgreSQL"

    @contextlib.asynccontextmanager
    async def fresh(self, kind: Kind, name: str) -> AsyncIterator[str]:
        """The URL of an empty store of ``kind``, removed after."""
        self.count += 1
        if kind == "sqlite":
            directory = self.ctx.scratch(f"sqlite-{self.count}-{name}")
            try:
                yield f"sqlite://{directory.resolve() / 'metadata.db'}"
            finally:
                shutil.rmtree(directory, ignore_errors=True)
            return
        async with pg_schema(self.pg_url, name) as url:
            yield url


Role = Literal["subject", "baseline"]


def _order(index: int, subject: Kind) -> list[tuple[Role, Kind]]:
    """The pair's sides in order, alternating: the baseline (SQLite) first in even pairs."""
    pair: list[tuple[Role, Kind]] = [("baseline", "sqlite"), ("subject", subject)]
    return pair if index % 2 == 0 else pair[::-1]


# --- 1. commits per second ---------------------------------------------------------------------------


async def _run_nodes(ctx: Context, url: str, spec: dict[str, Any], nodes: int) -> dict[str, Any]:
    """``nodes`` node processes on ``url``: setup, one start signal for all, their results summed.

    The store is created (schema and migrations) here first, untimed: SQLite refuses several processes
    migrating a new file at once (``database is locked`` from the first ``BEGIN IMMEDIATE``)."""
    store = await open_store(url)
    await store.close()
    cpus = ctx.cpus_for_children()
    logs = ctx.scratch("node-logs")
    processes: list[asyncio.subprocess.Process] = []
    try:
        for index in range(nodes):
            node = NodeSpec(
                url=url, node_id=index + 1, cpu=cpus[index % len(cpus)] if ctx.pin else None, **spec
            )
            with (logs / f"node-{index + 1}.err").open("wb") as err:
                processes.append(
                    await asyncio.create_subprocess_exec(
                        sys.executable,
                        "-m",
                        "benchmarks.workloads._metadata_node",
                        cwd=REPO_ROOT,
                        env={**os.environ, SPEC_ENV: node.to_env()},
                        stdin=asyncio.subprocess.PIPE,
                        stdout=asyncio.subprocess.PIPE,
                        stderr=err,
                    )
                )
        for index, process in enumerate(processes):
            assert process.stdout is not None
            line = await asyncio.wait_for(process.stdout.readline(), NODE_READY_TIMEOUT_S)
            if line.strip() != b"READY":
                raise RuntimeError(_node_failure(logs, index, f"said {line[:200]!r} instead of READY"))
        for process in processes:
            assert process.stdin is not None
            process.stdin.write(b"GO\n")
        outs = [await process.communicate() for process in processes]
        for index, (process, (out, _)) in enumerate(zip(processes, outs, strict=True)):
            if process.returncode != 0 or not out.strip():
                raise RuntimeError(_node_failure(logs, index, f"exit status {process.returncode}"))
    finally:
        for process in processes:
            if process.returncode is None:
                process.kill()
                await process.wait()
    import json

    reports = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    latency = LatencyRecorder()
    for report in reports:
        for seconds in report["latencies_s"]:
            latency.record(seconds)
    ops = sum(r["ops"] for r in reports)
    return {
        "ops_per_s": sum(r["ops"] / r["elapsed_s"] for r in reports),
        "ops": ops,
        "latency": latency,
        "client_cpu_ms_per_op": 1000 * sum(r["cpu_s"] for r in reports) / ops if ops else 0.0,
        "retries": sum(r["retries"] for r in reports),
        "open_retries": sum(r["open_retries"] for r in reports),
        "ops_by_node": [r["ops"] for r in reports],
        "cpus_by_node": [r["cpus"] for r in reports],
    }


def _node_failure(logs: Path, index: int, what: str) -> str:
    tail = (logs / f"node-{index + 1}.err").read_text(errors="replace")[-3000:]
    return f"metadata node {index + 1} failed ({what}):\n{tail}"


async def _commit_rows(ctx: Context, sides: Sides) -> list[Result]:
    streams = ctx.param("streams", 1000)
    warmup_s = ctx.param("warmup_s", ctx.scale(quick=0.5, full=2.0))
    duration_s = ctx.param("duration_s", ctx.scale(quick=2.0, full=10.0))
    node_counts = [int(n) for n in ctx.param("nodes", "1,8").split(",")]
    operations = [op for op in ctx.param("operations", ",".join(OPERATIONS)).split(",") if op]
    results: list[Result] = []
    pair = 0
    for operation in operations:
        if operation not in OPERATIONS:
            raise ValueError(f"--param operations: unknown {operation!r} (have {', '.join(OPERATIONS)})")
        for nodes in node_counts:
            spec = {
                "operation": operation,
                "streams": streams,
                "warmup_s": warmup_s,
                "duration_s": duration_s,
            }
            runs: dict[Role, dict[str, Any]] = {}
            for role, kind in _order(pair, sides.subject):
                ctx.status(f"metadata: {operation}, {nodes} node(s), {sides.label(kind)}")
                async with sides.fresh(kind, operation) as url:
                    runs[role] = await _run_nodes(ctx, url, spec, nodes)
            pair += 1
            subject, base = runs["subject"], runs["baseline"]
            label = LABELS[operation].format(streams=streams)
            results.append(
                Result(
                    W,
                    f"{label}, {nodes} node{'s' if nodes > 1 else ''}",
                    subject["ops_per_s"],
                    "ops/s",
                    "SQLite, same operations and node processes, same run",
                    base["ops_per_s"],
                    True,
                    {
                        "subject": f"{sides.label(sides.subject)} metadata store",
                        "latency_ms": subject["latency"].summary_ms(),
                        "baseline_latency_ms": base["latency"].summary_ms(),
                        "client_cpu_ms_per_op": subject["client_cpu_ms_per_op"],
                        "baseline_client_cpu_ms_per_op": base["client_cpu_ms_per_op"],
                        "retries": subject["retries"],
                        "baseline_retries": base["retries"],
                        "open_retries": subject["open_retries"],
                        "baseline_open_retries": base["open_retries"],
                        "ops_by_node": subject["ops_by_node"],
                        "baseline_ops_by_node": base["ops_by_node"],
                        "nodes": nodes,
                        "streams": streams,
                        "duration_s": duration_s,
                        "warmup_s": warmup_s,
                        "pinned": ctx.pin,
                        "cpus_by_node": subject["cpus_by_node"],
                    },
                )
            )
    return results


# --- 2. end-to-end ingest ----------------------------------------------------------------------------


async def _ingest_once(ctx: Context, url: str, tag: str, *, streams: int, producers: int, total_bytes: int) -> dict[str, float]:  # fmt: skip
    """One engine run on the store at ``url``: 1 KiB appends, then the drain."""
    storage = ctx.open_storage(f"ingest-{tag}")
    if isinstance(storage, S3ObjectStorage):
        await storage.connect()
    data_dir = ctx.scratch(f"engine-{tag}")
    store = await open_store(url)
    client = await open_client(data_dir, config=Config(), storage=storage, metadata=store)
    try:
        gate = asyncio.Semaphore(32)

        async def create() -> Any:
            async with gate:
                return await client.streams.create_and_open_stream()

        opened = await asyncio.gather(*(create() for _ in range(streams)))
        appends = total_bytes // KiB
        payload = os.urandom(KiB)

        async def producer(index: int) -> None:
            for n in range(index, appends, producers):
                await opened[n % streams].append(RecordBatch(payload))

        started = time.perf_counter()
        await asyncio.gather(*(producer(i) for i in range(producers)))
        ingest_s = time.perf_counter() - started
        await client.engine.force_upload(None)
        drain_s = time.perf_counter() - started
        stats = client.engine.stats
        return {
            "drain_mb_s": appends * KiB / 1e6 / drain_s,
            "ingest_mb_s": appends * KiB / 1e6 / ingest_s,
            "uploads": stats.uploads,
            "objects_committed": stats.objects_committed,
        }
    finally:
        await client.close()
        shutil.rmtree(data_dir, ignore_errors=True)


async def _ingest_row(ctx: Context, sides: Sides) -> Result:
    streams = ctx.param("ingest_streams", ctx.scale(quick=100, full=1000))
    producers = ctx.param("producers", 128)
    total_bytes = ctx.param("ingest_mib", ctx.scale(quick=8, full=128)) * MiB
    rounds = ctx.param("ingest_rounds", ctx.scale(quick=1, full=3))
    runs: dict[Role, list[dict[str, float]]] = {"subject": [], "baseline": []}
    for index in range(rounds):
        for role, kind in _order(index, sides.subject):
            ctx.status(f"metadata: 1 KiB ingest, {sides.label(kind)} metadata, round {index + 1}/{rounds}")
            async with sides.fresh(kind, "ingest") as url:
                runs[role].append(
                    await _ingest_once(
                        ctx,
                        url,
                        f"{role}-{index}",
                        streams=streams,
                        producers=producers,
                        total_bytes=total_bytes,
                    )
                )
    subject = [r["drain_mb_s"] for r in runs["subject"]]
    base = [r["drain_mb_s"] for r in runs["baseline"]]
    return Result(
        W,
        f"1 KiB ingest + drain MB/s, {streams} streams, {sides.label(sides.subject)} metadata",
        statistics.median(subject),
        "MB/s",
        "the same engine, config and object store with SQLite metadata",
        statistics.median(base),
        True,
        {
            "subject": f"engine with {sides.label(sides.subject)} metadata",
            "rounds": rounds,
            "drain_mb_s_rounds": subject,
            "baseline_drain_mb_s_rounds": base,
            "runs": runs["subject"],
            "baseline_runs": runs["baseline"],
            "producers": producers,
            "payload_bytes": total_bytes,
            "backend": "s3" if ctx.s3 is not None else "local",
            "goal_ratio": 0.9,
        },
    )


# --- the workload ------------------------------------------------------------------------------------


async def run(ctx: Context) -> list[Result]:
    sections = ctx.param("sections", "commits,ingest,reader").split(",")
    sides = Sides(ctx)
    if sides.subject == "postgresql":
        ctx.notes.append(f"PostgreSQL server: {redacted(sides.pg_url)}")
    else:
        ctx.notes.append("subject=sqlite: SQLite on both sides (a check of the method, not a figure)")
    results: list[Result] = []
    if "commits" in sections:
        results += await _commit_rows(ctx, sides)
    if "ingest" in sections:
        results.append(await _ingest_row(ctx, sides))
    if "reader" in sections:
        async with sides.fresh(sides.subject, "reader") as url:
            results += await reader_side.reader_rows(ctx, url, label=sides.label(sides.subject))
    return results
