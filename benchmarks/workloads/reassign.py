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
from pathlib import Path
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
EVENT_TIMEOUT_S = 60.0
NODE_READY_TIMEOUT_S = 300.0


def move_config(pending_bytes_max: int) -> dict[str, Any]:
    """The moving nodes' WAL settings: the upload threshold is 4x the largest move's pending bytes (at
    least 16 MiB) and the interval 10 minutes, so each move's pending bytes are all still un-uploaded
    when it is requested; the WAL and its cache are sized to hold that (a 1 GiB WAL for 64 MiB moves; a
    smaller one for smaller moves: creating a big WAL file costs seconds at every start)."""
    threshold = max(16 * MiB, 4 * pending_bytes_max)
    return {
        "wal_capacity_bytes": 4 * threshold,
        "wal_cache_size_bytes": 2 * threshold,
        "wal_upload_threshold_bytes": threshold,
        "wal_upload_interval_ms": 600_000,
    }


class NodeProcess:
    """A node process of :mod:`benchmarks.workloads._reassign_node`: its commands and replies, and (in
    ``move`` mode) its ``GAINED`` lines as futures by stream id, armed before the request they answer."""

    def __init__(self, process: asyncio.subprocess.Process, log_path: Path) -> None:
        self.process = process
        self.log_path = log_path
        self.ready: list[int] = []
        self._replies: asyncio.Queue[str] = asyncio.Queue()
        self._gains: dict[int, asyncio.Future[tuple[float, ...]]] = {}
        self._losses: dict[int, asyncio.Future[tuple[float, ...]]] = {}
        self._reader = asyncio.create_task(self._read(), name="bench-node-stdout")

    async def _read(self) -> None:
        assert self.process.stdout is not None
        while line := (await self.process.stdout.readline()).decode():
            if line.startswith(("GAINED ", "LOST ")):
                kind, sid, *times = line.split()
                waiting = self._gains if kind == "GAINED" else self._losses
                future = waiting.pop(int(sid), None)
                if future is not None and not future.done():
                    future.set_result(tuple(float(t) for t in times))
            else:
                await self._replies.put(line.strip())
        await self._replies.put("")  # the process closed its stdout (exited)

    async def reply(self, timeout_s: float = EVENT_TIMEOUT_S) -> str:
        line = await asyncio.wait_for(self._replies.get(), timeout_s)
        if not line:
            raise RuntimeError(f"node process {self.process.pid} exited: {self.log_tail()}")
        return line

    async def command(self, line: str, timeout_s: float = EVENT_TIMEOUT_S) -> str:
        assert self.process.stdin is not None
        self.process.stdin.write(line.encode() + b"\n")
        await self.process.stdin.drain()
        return await self.reply(timeout_s)

    def arm(self, stream_ids: list[int], kind: str = "GAINED") -> list[asyncio.Future[tuple[float, ...]]]:
        """Futures of the ``time.monotonic()`` values of each stream's next ``GAINED`` line here (the
        gained event, the first append's acknowledgement) or ``LOST`` line (the lost event)."""
        waiting = self._gains if kind == "GAINED" else self._losses
        loop = asyncio.get_running_loop()
        futures = []
        for sid in stream_ids:
            future: asyncio.Future[tuple[float, ...]] = loop.create_future()
            waiting[sid] = future
            futures.append(future)
        return futures

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    async def stop(self) -> None:
        """EXIT (a clean close), or a kill when it does not end within the close timeout."""
        if self.process.returncode is None and self.process.stdin is not None:
            with contextlib.suppress(ConnectionError, RuntimeError):
                self.process.stdin.write(b"EXIT\n")
                await self.process.stdin.drain()
            try:
                await asyncio.wait_for(self.process.wait(), 30)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self.process.kill()
                await self.process.wait()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._reader


async def _spawn(ctx: Context, spec: NodeSpec, log_name: str) -> NodeProcess:
    """Start one node process and wait for its ``READY`` line."""
    log_path = ctx.scratch("node-logs") / f"{log_name}.err"
    with log_path.open("wb") as err:
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
    node = NodeProcess(process, log_path)
    try:
        line = await node.reply(NODE_READY_TIMEOUT_S)
        if not line.startswith("READY"):
            raise RuntimeError(f"node {spec.node_id} said {line[:200]!r} instead of READY: {node.log_tail()}")
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await node.stop()
        raise
    node.ready = [int(s) for s in line.split()[1:]]
    return node


async def _spawn_all(ctx: Context, specs: list[tuple[NodeSpec, str]]) -> list[NodeProcess]:
    """Start the node processes at once (they open their clients concurrently); all or none."""
    started = await asyncio.gather(*(_spawn(ctx, spec, name) for spec, name in specs), return_exceptions=True)
    nodes = [n for n in started if isinstance(n, NodeProcess)]
    failure = next((n for n in started if isinstance(n, BaseException)), None)
    if failure is not None:
        for node in nodes:
            await node.stop()
        raise failure
    return nodes


def _cpu(ctx: Context, index: int) -> int | None:
    """``--pin``: the core of the ``index``-th process (round robin over ctx.cpus_for_children())."""
    if not ctx.pin:
        return None
    cpus = ctx.cpus_for_children()
    return cpus[index % len(cpus)]


def _bucket_uri(ctx: Context, name: str) -> str:
    if ctx.s3 is not None:
        return ctx.s3.uri(ctx.key_prefix(name))
    return f"file://{ctx.scratch(f'bucket-{name}').resolve()}"


def _config(url: str, node_id: int, **changes: Any) -> Config:
    return Config.from_sources(env={}, node_id=node_id, metadata_url=url, **changes)


async def _moves(
    ctx: Context,
    nodes: list[NodeProcess],
    requester: MetadataStore,
    *,
    label: str,
    streams: int,
    pending_bytes: int,
    moves: int,
) -> tuple[LatencyRecorder, list[float], dict[str, list[float]]]:
    """``moves`` reassignments of ``streams`` new streams between the two node processes; the times in
    seconds, from just before the request to the last of the streams' first appends acknowledged on
    the new owner (both sides read CLOCK_MONOTONIC), and the same time in three phases (the last
    stream's of each): ``owner_closed`` (request to the old owner's last "lost" event: its poll, the
    drain, the upload, the metadata closes), ``target_opened`` (from there to the new owner's last
    "gained" event: its poll, describe and open) and ``first_append`` (from there to the last first
    append acknowledged)."""
    reply = await nodes[0].command(f"CREATE {streams}")
    ids = [int(s) for s in reply.split()[1:]]
    latency = LatencyRecorder()
    samples: list[float] = []
    phases: dict[str, list[float]] = {"owner_closed": [], "target_opened": [], "first_append": []}
    owner = 0
    for index in range(moves):
        ctx.status(f"reassign: {label}, move {index + 1}/{moves}")
        if pending_bytes > 0:
            await nodes[owner].command(f"FILL {pending_bytes} " + " ".join(map(str, ids)))
        target = 1 - owner
        lost = nodes[owner].arm(ids, "LOST")
        gained = nodes[target].arm(ids)
        started = time.monotonic()
        await requester.request_reassign(stream_ids=[StreamId(s) for s in ids], to_node_id=NodeId(target + 1))
        gains = await asyncio.wait_for(asyncio.gather(*gained), EVENT_TIMEOUT_S)
        losses = await asyncio.wait_for(asyncio.gather(*lost), EVENT_TIMEOUT_S)
        closed_at = max(t[0] for t in losses)
        opened_at = max(t[0] for t in gains)
        acked_at = max(t[1] for t in gains)
        took_s = acked_at - started
        latency.record(took_s)
        samples.append(took_s)
        phases["owner_closed"].append(closed_at - started)
        phases["target_opened"].append(opened_at - closed_at)
        phases["first_append"].append(acked_at - opened_at)
        owner = target
    return latency, samples, phases


def _percentiles_ms(values: list[float]) -> dict[str, float]:
    recorder = LatencyRecorder()
    for value in values:
        recorder.record(value)
    summary = recorder.summary_ms()
    return {"p50": summary["p50"], "p99": summary["p99"], "max": summary["max"]}


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
    measured = []
    async with _fresh(ctx, "moves") as url:
        bucket = _bucket_uri(ctx, "moves")
        ctx.status("reassign: starting the two moving node processes")
        specs = [
            (
                NodeSpec(
                    metadata_url=url,
                    bucket_uri=bucket,
                    data_dir=str(ctx.scratch(f"moves-node{node_id}")),
                    node_id=node_id,
                    mode="move",
                    cpu=_cpu(ctx, node_id - 1),
                    config=move_config(max(pending for _, pending, _, _ in cases)),
                ),
                f"moves-{node_id}",
            )
            for node_id in (1, 2)
        ]
        nodes = await _spawn_all(ctx, specs)
        requester: MetadataStore = await open_metadata_store(url)
        try:
            for streams, pending, label, goal_s in cases:
                latency, samples, phases = await _moves(
                    ctx, nodes, requester, label=label, streams=streams, pending_bytes=pending, moves=moves
                )
                measured.append((streams, pending, label, goal_s, latency, samples, phases))
        finally:
            await requester.close()
            for node in nodes:
                await node.stop()
    results = []
    for streams, pending, label, goal_s, latency, samples, phases in measured:
        ctx.status(f"reassign: raw PUT baseline, {pending} bytes")
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
                    "phases_ms": {name: _percentiles_ms(values) for name, values in phases.items()},
                    "moves": moves,
                    "streams": streams,
                    "pending_bytes": pending,
                    "goal_p99_ms": goal_s * 1000,
                    "goal_met": mine["p99"] < goal_s * 1000,
                    "cluster_poll_ms": Config().cluster_poll_ms,
                    "nodes": "2 node processes",
                },
            )
        )
    return results


class GainWatch:
    """This process's node's "gained" events as futures by stream id (armed before the kill they answer)."""

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


async def _first_appends(gained: list[asyncio.Future[Stream]], payload: bytes) -> list[Stream]:
    """Each stream's first append on its new owner, as soon as that owner has it."""

    async def one(future: asyncio.Future[Stream]) -> Stream:
        stream = await future
        await stream.append(RecordBatch(payload))
        return stream

    return await asyncio.wait_for(asyncio.gather(*(one(f) for f in gained)), EVENT_TIMEOUT_S)


async def _failover_rows(ctx: Context) -> list[Result]:
    rounds = ctx.param("failover_rounds", ctx.scale(quick=1, full=5))
    lease_ms = ctx.param("failover_lease_ms", ctx.scale(quick=2000, full=3000))
    count = ctx.param("failover_streams", 4)
    latency = LatencyRecorder()
    samples = []
    async with _fresh(ctx, "failover") as url:
        bucket = _bucket_uri(ctx, "failover")

        def victim_spec(index: int) -> NodeSpec:
            return NodeSpec(
                metadata_url=url,
                bucket_uri=bucket,
                data_dir=str(ctx.scratch(f"failover-victim-{index}")),
                node_id=10 + index,
                mode="hold",
                streams=count,
                cpu=_cpu(ctx, 1),
                config={"node_lease_ms": lease_ms},
            )

        ctx.status("reassign: failover, opening the surviving node and the first victim")
        first_victim = asyncio.create_task(_spawn(ctx, victim_spec(0), "victim-0"))
        try:
            survivor = await open_client(
                ctx.scratch("failover-node1"),
                bucket_uri=bucket,
                config=_config(url, 1, node_lease_ms=lease_ms),
            )
        except BaseException:
            with contextlib.suppress(Exception):
                await (await first_victim).stop()
            raise
        watch = GainWatch(survivor)
        victims: list[NodeProcess] = []
        try:
            for index in range(rounds):
                ctx.status(f"reassign: failover {index + 1}/{rounds} (lease {lease_ms} ms)")
                victim = await (
                    first_victim if index == 0 else _spawn(ctx, victim_spec(index), f"victim-{index}")
                )
                victims.append(victim)
                await asyncio.sleep(ctx.scale(quick=0.5, full=1.0))  # appends in its WAL, not uploaded
                gained = watch.arm([StreamId(s) for s in victim.ready])
                started = time.perf_counter()
                os.kill(victim.process.pid, signal.SIGKILL)
                await victim.process.wait()
                streams = await _first_appends(gained, b"after failover")
                took_s = time.perf_counter() - started
                latency.record(took_s)
                samples.append(took_s)
                for stream in streams:  # back to CLOSED so the next round's streams stand alone
                    await stream.close()
        finally:
            for victim in victims:  # killed already unless a round failed before its kill
                with contextlib.suppress(ProcessLookupError):
                    victim.process.kill()
                await victim.stop()
            if not first_victim.done():
                first_victim.cancel()
            await watch.close()
            await survivor.close()
    mine = latency.summary_ms()
    goal_s = lease_ms / 1000 + 2
    return [
        Result(
            W,
            f"failover time p99 (SIGKILL to first append acked elsewhere), {count} streams, "
            f"lease {lease_ms} ms, {rounds} kill{'s' if rounds > 1 else ''}",
            mine["p99"] / 1000,
            "s",
            "the configured lease (s3.node.lease.ms)",
            lease_ms / 1000,
            False,
            {
                "latency_ms": mine,
                "p50_s": mine["p50"] / 1000,
                "samples_s": [round(s, 3) for s in samples],
                "goal_s": goal_s,
                "goal_met": mine["p99"] / 1000 < goal_s,
                "lease_ms": lease_ms,
                "streams": count,
                "cluster_poll_ms": Config().cluster_poll_ms,
            },
        )
    ]


async def _cluster_runs(
    ctx: Context, url: str, counts: list[int], spec: dict[str, Any], duration_s: float
) -> dict[int, dict[str, Any]]:
    """``max(counts)`` append node processes started at once; for each count, one ``GO`` to that many
    of them at once and their rates summed (the others idle meanwhile)."""
    bucket = _bucket_uri(ctx, f"append-{max(counts)}")
    specs = [
        (
            NodeSpec(
                metadata_url=url,
                bucket_uri=bucket,
                data_dir=str(ctx.scratch(f"append-{max(counts)}-node{node_id}")),
                node_id=node_id,
                mode="append",
                cpu=_cpu(ctx, node_id - 1),
                **spec,
            ),
            f"append-{max(counts)}-{node_id}",
        )
        for node_id in range(1, max(counts) + 1)
    ]
    processes = await _spawn_all(ctx, specs)
    runs = {}
    try:
        for nodes in counts:
            ctx.status(f"reassign: cluster appends/s, {nodes} node process(es)")
            replies = await asyncio.gather(
                *(p.command(f"GO {duration_s}", duration_s + EVENT_TIMEOUT_S) for p in processes[:nodes])
            )
            reports = [json.loads(line) for line in replies]
            runs[nodes] = {
                "appends_per_s": sum(r["appends"] / r["elapsed_s"] for r in reports),
                "by_node": [round(r["appends"] / r["elapsed_s"]) for r in reports],
                "cpu_s": [round(r["cpu_s"], 2) for r in reports],
                "idle_node_processes": len(processes) - nodes,
            }
    finally:
        for process in processes:
            await process.stop()
    return runs


async def _cluster_rows(ctx: Context) -> list[Result]:
    """Full runs start fresh processes (and a fresh schema) for each count; ``--quick`` (or
    ``--param append_fresh=0``) starts the largest count once and reuses its processes."""
    counts = [int(n) for n in ctx.param("node_counts", "1,2,3").split(",")]
    spec = {"streams": ctx.param("node_streams", 8), "producers": ctx.param("producers", 64)}
    duration_s = ctx.param("append_s", ctx.scale(quick=1.0, full=10.0))
    fresh = ctx.param("append_fresh", ctx.scale(quick=0, full=1))
    groups = [[n] for n in counts] if fresh else [counts]
    runs: dict[int, dict[str, Any]] = {}
    for group in groups:
        async with _fresh(ctx, "append") as url:
            runs.update(await _cluster_runs(ctx, url, group, spec, duration_s))
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
                "idle_node_processes": run["idle_node_processes"],
                "cpus": os.cpu_count(),
                "duration_s": duration_s,
                "pinned": ctx.pin,
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
