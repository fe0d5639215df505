"""Workload ``reassign``: how fast a stream changes node, how fast a dead node's streams come back, and
what a cluster of node processes appends per second.

Every part runs on PostgreSQL metadata (``--metadata-url``, else ``S3STREAM_TEST_PG_URL``, else the
project's ``scripts/postgres``; a fresh schema per part, dropped after) and the run's object store.

1. **Reassignment time** (goal: p99 < 1 s for one stream with up to 64 MiB pending, < 2 s for 100
   streams): two nodes (two clients with their own data dirs in this process, on one event loop), the
   streams ping-ponged between them ``moves`` times. Before each move the current owner appends the
   case's pending bytes (1 MiB records; the upload threshold and interval are set so none of it is
   uploaded yet); the time runs from the request (``request_reassign`` on a metadata client of its
   own, like ``s3stream reassign``) to the first append acknowledged on the new owner, which learns it
   gained the stream from ``client.streams.assignments()``; for several streams, to the last of their
   first appends. Baseline: a raw PUT of the same number of bytes (one object) to the same store,
   ``baseline_puts`` times.
2. **Failover time** (goal: lease + 2 s): a node process (:mod:`benchmarks.workloads._reassign_node`,
   ``hold``) owns ``failover_streams`` streams and appends to them; it is killed with SIGKILL; the time
   runs from the kill to the first append acknowledged on the surviving node (in this process, the
   controller) for every one of its streams. Compared with the configured lease (``failover_lease_ms``).
3. **Cluster appends/s** with 1, 2 and 3 node processes (``append``: 1 KiB records, ``producers``
   concurrent appends each, over ``node_streams`` streams of its own, ``append_s`` seconds); the figure is
   the sum over the processes; the baseline is the one-process figure of the same run (no goal: the
   machine has few cores and the processes share them).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

from benchmarks.core import Context, Result
from benchmarks.measure import LatencyRecorder
from benchmarks.pgserver import REPO_ROOT, pg_schema, redacted, resolve_pg_url
from benchmarks.workloads._reassign_node import SPEC_ENV, NodeSpec
from s3stream.assembly import open_client
from s3stream.config import Config
from s3stream.engine.client import Client, Stream
from s3stream.ids import NodeId, StreamId
from s3stream.metadata.base import MetadataStore
from s3stream.metadata.url import open_metadata_store
from s3stream.model import RecordBatch

W = "reassign"
KiB = 1 << 10
MiB = 1 << 20
FILL_RECORD_BYTES = 1 * MiB
EVENT_TIMEOUT_S = 60.0
NODE_READY_TIMEOUT_S = 300.0
MOVE_CONFIG: dict[str, Any] = {
    "wal_capacity_bytes": 1024 * MiB,
    "wal_cache_size_bytes": 512 * MiB,
    "wal_upload_threshold_bytes": 256 * MiB,
    "wal_upload_interval_ms": 600_000,
}
"""The moving nodes hold up to 256 MiB un-uploaded: each move's pending bytes are all still pending
when it is requested."""


class GainWatch:
    """One node's "gained" events as futures by stream id (armed before the request they answer)."""

    def __init__(self, client: Client) -> None:
        self._waiting: dict[int, asyncio.Future[Stream]] = {}
        self._task = asyncio.create_task(self._pump(client), name="bench-gains")

    def arm(self, stream_ids: list[StreamId]) -> list[asyncio.Future[Stream]]:
        loop = asyncio.get_running_loop()
        futures = []
        for stream_id in stream_ids:
            future: asyncio.Future[Stream] = loop.create_future()
            self._waiting[stream_id] = future
            futures.append(future)
        return futures

    async def _pump(self, client: Client) -> None:
        async for event in client.streams.assignments():
            if event.kind == "gained" and event.stream is not None:
                future = self._waiting.pop(event.stream_id, None)
                if future is not None and not future.done():
                    future.set_result(event.stream)

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task


def _bucket_uri(ctx: Context, name: str) -> str:
    if ctx.s3 is not None:
        return ctx.s3.uri(ctx.key_prefix(name))
    return f"file://{ctx.scratch(f'bucket-{name}').resolve()}"


def _config(url: str, node_id: int, **changes: Any) -> Config:
    return Config.from_sources(env={}, node_id=node_id, metadata_url=url, **changes)


async def _first_appends(gained: list[asyncio.Future[Stream]], payload: bytes) -> list[Stream]:
    """Each stream's first append on its new owner, as soon as that owner has it."""

    async def one(future: asyncio.Future[Stream]) -> Stream:
        stream = await future
        await stream.append(RecordBatch(payload))
        return stream

    return await asyncio.wait_for(asyncio.gather(*(one(f) for f in gained)), EVENT_TIMEOUT_S)


async def _fill(streams: list[Stream], pending_bytes: int) -> None:
    """``pending_bytes`` in 1 MiB records spread over ``streams`` (less for a smaller total)."""
    if pending_bytes <= 0:
        return
    per_stream = max(1, pending_bytes // len(streams))
    record = os.urandom(min(FILL_RECORD_BYTES, per_stream))
    appends = []
    for stream in streams:
        left = per_stream
        while left > 0:
            appends.append(stream.append(RecordBatch(record[: min(left, len(record))])))
            left -= min(left, len(record))
    await asyncio.gather(*appends)


async def _moves(
    ctx: Context, url: str, *, name: str, streams: int, pending_bytes: int, moves: int
) -> tuple[LatencyRecorder, list[float]]:
    """``moves`` reassignments of ``streams`` streams between two nodes; the times in seconds."""
    bucket = _bucket_uri(ctx, f"moves-{name}")
    nodes: list[Client] = []
    watches: list[GainWatch] = []
    requester: MetadataStore = await open_metadata_store(url)
    latency = LatencyRecorder()
    samples: list[float] = []
    try:
        for node_id in (1, 2):
            data_dir = ctx.scratch(f"moves-{name}-node{node_id}")
            nodes.append(
                await open_client(data_dir, bucket_uri=bucket, config=_config(url, node_id, **MOVE_CONFIG))
            )
            watches.append(GainWatch(nodes[-1]))
        owned = [await nodes[0].streams.create_and_open_stream() for _ in range(streams)]
        ids = [s.stream_id for s in owned]
        owner = 0
        payload = b"x" * 100
        for index in range(moves):
            ctx.status(f"reassign: {name}, move {index + 1}/{moves}")
            await _fill(owned, pending_bytes)
            target = 1 - owner
            gained = watches[target].arm(ids)
            started = time.perf_counter()
            await requester.request_reassign(stream_ids=ids, to_node_id=NodeId(target + 1))
            owned = await _first_appends(gained, payload)
            took_s = time.perf_counter() - started
            latency.record(took_s)
            samples.append(took_s)
            owner = target
    finally:
        for watch in watches:
            await watch.close()
        for node in nodes:
            await node.close()
        await requester.close()
    return latency, samples


async def _raw_puts(ctx: Context, name: str, size_bytes: int, count: int) -> LatencyRecorder:
    storage = ctx.open_storage(f"raw-put-{name}")
    connect = getattr(storage, "connect", None)
    if connect is not None:
        await connect()
    latency = LatencyRecorder()
    data = os.urandom(size_bytes)
    keys = []
    try:
        await storage.put("warmup", data[: min(size_bytes, MiB)])
        keys.append("warmup")
        for index in range(count):
            key = f"put-{index}"
            with latency.time():
                await storage.put(key, data)
            keys.append(key)
        await storage.delete(keys)
    finally:
        await storage.close()
    return latency


@contextlib.asynccontextmanager
async def _fresh(ctx: Context, name: str) -> AsyncIterator[str]:
    async with pg_schema(resolve_pg_url(ctx.metadata_url, ctx.status), name) as url:
        yield url


async def _move_rows(ctx: Context) -> list[Result]:
    moves = ctx.param("moves", ctx.scale(quick=3, full=50))
    puts = ctx.param("baseline_puts", ctx.scale(quick=3, full=10))
    sizes_mib = [int(s) for s in ctx.param("sizes_mib", ctx.scale(quick="0,1", full="0,8,64")).split(",")]
    multi = ctx.param("multi_streams", ctx.scale(quick=10, full=100))
    multi_pending = ctx.param("multi_pending_kib", 64) * KiB
    cases = [(1, size * MiB, f"1 stream, {size} MiB pending", 1.0) for size in sizes_mib]
    cases.append(
        (
            multi,
            multi * multi_pending,
            f"{multi} streams at once, {multi_pending // KiB} KiB pending each",
            2.0,
        )
    )
    results = []
    for streams, pending, label, goal_s in cases:
        async with _fresh(ctx, "moves") as url:
            latency, samples = await _moves(
                ctx, url, name=f"{streams}x{pending}", streams=streams, pending_bytes=pending, moves=moves
            )
        base = await _raw_puts(ctx, f"{streams}x{pending}", pending, puts)
        mine, raw = latency.summary_ms(), base.summary_ms()
        results.append(
            Result(
                W,
                f"reassignment p99 (request to first append acked on the new owner), {label}",
                mine["p99"],
                "ms",
                f"raw PUT of the same {pending} bytes (one object), same store, same run (p99)",
                raw["p99"],
                False,
                {
                    "latency_ms": mine,
                    "baseline_latency_ms": raw,
                    "p50_ms": mine["p50"],
                    "baseline_p50_ms": raw["p50"],
                    "samples_ms": [round(s * 1000, 1) for s in samples],
                    "moves": moves,
                    "streams": streams,
                    "pending_bytes": pending,
                    "goal_p99_ms": goal_s * 1000,
                    "cluster_poll_ms": Config().cluster_poll_ms,
                    "nodes": "2 clients in one process (one event loop)",
                },
            )
        )
    return results


async def _spawn(ctx: Context, spec: NodeSpec, log_name: str) -> tuple[asyncio.subprocess.Process, list[int]]:
    logs = ctx.scratch("node-logs")
    with (logs / f"{log_name}.err").open("wb") as err:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "benchmarks.workloads._reassign_node",
            cwd=REPO_ROOT,
            env={**os.environ, SPEC_ENV: spec.to_env()},
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=err,
        )
    assert process.stdout is not None
    line = (await asyncio.wait_for(process.stdout.readline(), NODE_READY_TIMEOUT_S)).decode()
    if not line.startswith("READY"):
        process.kill()
        await process.wait()
        tail = (logs / f"{log_name}.err").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"node {spec.node_id} said {line[:200]!r} instead of READY:\n{tail}")
    return process, [int(s) for s in line.split()[1:]]


async def _failover_rows(ctx: Context) -> list[Result]:
    rounds = ctx.param("failover_rounds", ctx.scale(quick=1, full=5))
    lease_ms = ctx.param("failover_lease_ms", ctx.scale(quick=2000, full=3000))
    count = ctx.param("failover_streams", 4)
    latency = LatencyRecorder()
    samples = []
    async with _fresh(ctx, "failover") as url:
        bucket = _bucket_uri(ctx, "failover")
        survivor = await open_client(
            ctx.scratch("failover-node1"), bucket_uri=bucket, config=_config(url, 1, node_lease_ms=lease_ms)
        )
        watch = GainWatch(survivor)
        try:
            for index in range(rounds):
                ctx.status(f"reassign: failover {index + 1}/{rounds} (lease {lease_ms} ms)")
                spec = NodeSpec(
                    metadata_url=url,
                    bucket_uri=bucket,
                    data_dir=str(ctx.scratch(f"failover-victim-{index}")),
                    node_id=10 + index,
                    mode="hold",
                    streams=count,
                    config={"node_lease_ms": lease_ms},
                )
                process, ids = await _spawn(ctx, spec, f"victim-{index}")
                await asyncio.sleep(ctx.scale(quick=0.5, full=1.0))  # appends in its WAL, not uploaded
                gained = watch.arm([StreamId(s) for s in ids])
                started = time.perf_counter()
                os.kill(process.pid, signal.SIGKILL)
                await process.wait()
                streams = await _first_appends(gained, b"after failover")
                took_s = time.perf_counter() - started
                latency.record(took_s)
                samples.append(took_s)
                for stream in streams:  # back to CLOSED so the next round's streams stand alone
                    await stream.close()
        finally:
            await watch.close()
            await survivor.close()
    mine = latency.summary_ms()
    return [
        Result(
            W,
            f"failover time (SIGKILL to first append acked elsewhere), {count} streams, lease {lease_ms} ms",
            mine["p50"] / 1000,
            "s",
            "the configured lease (s3.node.lease.ms)",
            lease_ms / 1000,
            False,
            {
                "latency_ms": mine,
                "samples_s": [round(s, 3) for s in samples],
                "goal_s": lease_ms / 1000 + 2,
                "lease_ms": lease_ms,
                "streams": count,
                "cluster_poll_ms": Config().cluster_poll_ms,
            },
        )
    ]


async def _cluster_run(ctx: Context, url: str, nodes: int, spec: dict[str, Any]) -> dict[str, Any]:
    bucket = _bucket_uri(ctx, f"append-{nodes}")
    processes = []
    try:
        for node_id in range(1, nodes + 1):
            node = NodeSpec(
                metadata_url=url,
                bucket_uri=bucket,
                data_dir=str(ctx.scratch(f"append-{nodes}-node{node_id}")),
                node_id=node_id,
                mode="append",
                **spec,
            )
            processes.append((await _spawn(ctx, node, f"append-{nodes}-{node_id}"))[0])
        for process in processes:
            assert process.stdin is not None
            process.stdin.write(b"GO\n")
        outs = [await process.communicate() for process in processes]
    finally:
        for process in processes:
            if process.returncode is None:
                process.kill()
                await process.wait()
    reports = []
    for process, (out, _) in zip(processes, outs, strict=True):
        if process.returncode != 0 or not out.strip():
            raise RuntimeError(f"append node exited {process.returncode}: {out[-500:]!r}")
        reports.append(json.loads(out.strip().splitlines()[-1]))
    return {
        "appends_per_s": sum(r["appends"] / r["elapsed_s"] for r in reports),
        "by_node": [round(r["appends"] / r["elapsed_s"]) for r in reports],
        "cpu_s": [round(r["cpu_s"], 2) for r in reports],
    }


async def _cluster_rows(ctx: Context) -> list[Result]:
    counts = [int(n) for n in ctx.param("node_counts", "1,2,3").split(",")]
    spec = {
        "streams": ctx.param("node_streams", 8),
        "producers": ctx.param("producers", 64),
        "duration_s": ctx.param("append_s", ctx.scale(quick=2.0, full=10.0)),
    }
    runs: dict[int, dict[str, Any]] = {}
    for nodes in counts:
        ctx.status(f"reassign: cluster appends/s, {nodes} node process(es)")
        async with _fresh(ctx, "append") as url:
            runs[nodes] = await _cluster_run(ctx, url, nodes, spec)
    base = runs[counts[0]]["appends_per_s"]
    return [
        Result(
            W,
            f"cluster 1 KiB appends/s, {nodes} node process{'es' if nodes > 1 else ''}",
            run["appends_per_s"],
            "appends/s",
            f"{counts[0]} node process, same run",
            base,
            True,
            {
                "appends_per_s_by_node": run["by_node"],
                "cpu_s_by_node": run["cpu_s"],
                "cpus": os.cpu_count(),
                **spec,
            },
        )
        for nodes, run in runs.items()
    ]


async def run(ctx: Context) -> list[Result]:
    sections = ctx.param("sections", "moves,failover,cluster").split(",")
    ctx.notes.append(f"PostgreSQL server: {redacted(resolve_pg_url(ctx.metadata_url, ctx.status))}")
    results: list[Result] = []
    if "moves" in sections:
        results += await _move_rows(ctx)
    if "failover" in sections:
        results += await _failover_rows(ctx)
    if "cluster" in sections:
        results += await _cluster_rows(ctx)
    return results
