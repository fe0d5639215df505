"""Workload ``buckets``: several buckets, each behind its own fault proxy, against one such bucket.

Every bucket here is a key prefix of the S3 target reached through its own fault proxy process
(:mod:`benchmarks.fault_proxy`), so each has a bandwidth of its own and can be failed on its own.
The engine is the embedded one (block WAL in the scratch dir, SQLite metadata), opened with a bucket
list (``0@s3://..,1@s3://..``) or one bucket; ``producers`` tasks append ``record_bytes`` records
round robin over ``streams`` streams until ``total_bytes`` are acknowledged, then the engine uploads
everything (``force_upload``). Figures, each beside its baseline from the same run:

- **round robin upload MB/s**: payload / (first append to everything committed), 2 buckets each
  throttled to ``rate_mib_s`` (default 4 MiB/s) vs 1 bucket throttled the same (goal >= 1.8x:
  bandwidth adds up). The extras give the request bytes each bucket's proxy forwarded per run.
- **replication upload MB/s**: the same with ``replication`` over the 2 buckets (every object in
  both) vs the 1 bucket: what a second copy costs (reported, no goal).
- **failover s**: ``failover`` over 2 unthrottled buckets while records are appended at a steady
  rate; the primary's proxy is then blackholed (requests accepted, never answered) and the figure is
  the time from that moment to the commit of the first object placed on the standby (the objects'
  ``committed_at_ms``; goal <= 5 s). Its baseline is the median gap between commits before the
  failure (how often an object is committed at all). The extras give the longest append stall seen
  during the outage (appends must not stop) and the commits after the failure. Measured twice: with
  the data dir's SQLite metadata, whose copy (every metadata write waits until the copy holds it)
  goes to the first healthy bucket, the primary, until that is marked unhealthy; and with the
  metadata in PostgreSQL (``--metadata-url``, else ``S3STREAM_TEST_PG_URL``, else
  ``scripts/postgres``; a fresh schema), which has no copy in the buckets.

The throughput runs set ``s3.data.buckets.request.timeout.ms`` to 30 s (a throttled object takes
seconds; the 2 s default is for failover); the failover run keeps the default. Needs an S3 target.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from benchmarks.core import Context, Result, S3Target
from benchmarks.fault_proxy import FaultProxy
from benchmarks.pgserver import pg_schema, resolve_pg_url
from s3stream.assembly import open_client
from s3stream.config import Config
from s3stream.metadata.base import ObjectState
from s3stream.model import RecordBatch

WORKLOAD = "buckets"
MiB = 1024 * 1024
GOAL_ROUND_ROBIN_RATIO = 1.8
GOAL_FAILOVER_S = 5.0
FAILOVER_WAIT_S_MAX = 60.0
"""How long the failover run waits for a commit on the standby before it reports a failure."""
THROUGHPUT_REQUEST_TIMEOUT_MS = 30_000
UPLOAD_INFLIGHT_MAX = 8
"""``s3.wal.upload.inflight.max`` of the throughput runs, both sides (``--param inflight=N``). Uploads
commit in order, so with the default 4 each of 2 buckets had 2 objects in flight and round robin
reached 1.78-1.84x; with 8 (4 per bucket) 1.91-1.96x."""
RATE_MIB_S_DEFAULT = 4.0
"""Each proxy's throttle: low enough that the bucket's bandwidth, not this machine's CPU (engine,
proxies and the S3 server share it), is what limits a run; ``--param rate_mib_s=N`` changes it."""
COMMITS_SHOWN_MAX = 10
"""Commits after the failure listed in the failover figure's extras (ms after it, bucket ids)."""


@dataclass(frozen=True)
class Run:
    """One engine run's upload figures."""

    payload_bytes: int
    seconds: float
    objects: int

    @property
    def mb_per_s(self) -> float:
        return self.payload_bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0


def bucket_uri(target: S3Target, endpoint: str, prefix: str, bucket_id: int) -> str:
    """``target``'s bucket reached at ``endpoint`` (a proxy) under ``prefix``, with id ``bucket_id``."""
    return (
        f"{bucket_id}@s3://{target.bucket}?region={target.region}&endpoint={quote(endpoint, safe=':/')}"
        f"&pathStyle=true&accessKey={quote(target.access_key)}&secretKey={quote(target.secret_key)}"
        f"&prefix={quote(prefix)}"
    )


def throughput_results(
    *, single: Run, round_robin: Run, replication: Run, rate_mib_s: float, extra: dict[str, Any]
) -> list[Result]:
    """The two throughput figures against the one-bucket baseline (pure)."""
    base = f"1 bucket behind a proxy at {rate_mib_s:g} MiB/s"
    common = {**extra, "baseline_objects": single.objects, "rate_mib_s": rate_mib_s}
    return [
        Result(
            WORKLOAD,
            f"round robin over 2 buckets at {rate_mib_s:g} MiB/s each: upload MB/s",
            round_robin.mb_per_s,
            "MB/s",
            base,
            single.mb_per_s,
            extra={**common, "objects": round_robin.objects, "goal_ratio_min": GOAL_ROUND_ROBIN_RATIO},
        ),
        Result(
            WORKLOAD,
            f"replication over 2 buckets at {rate_mib_s:g} MiB/s each: upload MB/s",
            replication.mb_per_s,
            "MB/s",
            base,
            single.mb_per_s,
            extra={**common, "objects": replication.objects},
        ),
    ]


def failover_result(
    *,
    failed_at_ms: int,
    commits: Sequence[tuple[int, tuple[int, ...]]],
    standby: int,
    stall_ms_max: float,
) -> Result:
    """Time from the primary's failure to the first commit on ``standby``, beside the median gap
    between commits before the failure (pure). ``commits``: (committed_at_ms, bucket ids) per object."""
    before = sorted(at for at, _ in commits if at < failed_at_ms)
    gaps = [b - a for a, b in itertools.pairwise(before)]
    on_standby = sorted(at for at, buckets in commits if at >= failed_at_ms and standby in buckets)
    if not on_standby:
        raise RuntimeError("no object was committed on the standby after the primary failed")
    failover_s = (on_standby[0] - failed_at_ms) / 1000
    return Result(
        WORKLOAD,
        "failover: primary blackholed -> first upload committed on the standby (s)",
        failover_s,
        "s",
        "median gap between commits before the failure",
        statistics.median(gaps) / 1000 if gaps else float("nan"),
        higher_is_better=False,
        extra={
            "goal_s_max": GOAL_FAILOVER_S,
            "commits_before": len(before),
            "append_stall_ms_max": round(stall_ms_max, 1),
            "commits_after_ms": [
                [at - failed_at_ms, list(buckets)] for at, buckets in sorted(commits) if at >= failed_at_ms
            ][:COMMITS_SHOWN_MAX],
        },
    )


def _config(strategy: str, **fields: Any) -> Config:
    return Config(
        data_buckets_strategy=strategy,  # type: ignore[arg-type]
        wal_upload_threshold_bytes=fields.pop("wal_upload_threshold_bytes", 4 * MiB),
        **fields,
    )


async def _appenders(streams: Sequence[Any], *, total_bytes: int, record_bytes: int, producers: int) -> None:
    payload = os.urandom(record_bytes)
    appends = total_bytes // record_bytes

    async def producer(index: int) -> None:
        for n in range(index, appends, producers):
            await streams[n % len(streams)].append(RecordBatch(payload))

    await asyncio.gather(*(producer(i) for i in range(producers)))


async def _upload_run(
    data_dir: Path, bucket_list: str, config: Config, *, total_bytes: int, record_bytes: int
) -> Run:
    """Append ``total_bytes`` and wait until everything is committed; payload / that time."""
    client = await open_client(str(data_dir), bucket_uri=bucket_list, config=config)
    try:
        streams = [await client.streams.create_and_open_stream() for _ in range(8)]
        started = time.perf_counter()
        await _appenders(streams, total_bytes=total_bytes, record_bytes=record_bytes, producers=16)
        await client.engine.force_upload(None)
        seconds = time.perf_counter() - started
        objects = len(await client.engine.metadata.list_objects([ObjectState.COMMITTED]))
    finally:
        await client.close()
    return Run((total_bytes // record_bytes) * record_bytes, seconds, objects)


async def _failover_run(
    ctx: Context,
    data_dir: Path,
    bucket_list: str,
    primary: FaultProxy,
    *,
    rate_bytes_per_s: int,
    metadata_url: str = "",
) -> Result:
    """Steady appends; blackhole ``primary`` once a few objects are committed; measure (see module doc).
    ``metadata_url``: shared metadata (no metadata copy in the buckets), else the data dir's SQLite."""
    config = _config(
        "failover",
        wal_upload_threshold_bytes=256 * 1024,
        wal_upload_interval_ms=200,
        data_buckets_probe_interval_ms=200,
        metadata_url=metadata_url,
    )
    client = await open_client(str(data_dir), bucket_uri=bucket_list, config=config)
    metadata = client.engine.metadata
    stop = asyncio.Event()
    stall_ms_max = 0.0
    failed_at_ms: int | None = None
    record_bytes = 16 * 1024
    try:
        stream = await client.streams.create_and_open_stream()

        async def append_steadily() -> None:
            nonlocal stall_ms_max
            payload = os.urandom(record_bytes)
            interval_s = record_bytes / rate_bytes_per_s
            while not stop.is_set():
                started = time.perf_counter()
                await stream.append(RecordBatch(payload))
                took_ms = (time.perf_counter() - started) * 1000
                if failed_at_ms is not None:
                    stall_ms_max = max(stall_ms_max, took_ms)
                await asyncio.sleep(max(0.0, interval_s - took_ms / 1000))

        appender = asyncio.get_running_loop().create_task(append_steadily())
        try:
            while len(await metadata.list_objects([ObjectState.COMMITTED])) < 5:  # noqa: ASYNC110 - polls the store
                await asyncio.sleep(0.1)
            ctx.status("buckets: failover: primary blackholed")
            await asyncio.to_thread(primary.blackhole)
            failed_at_ms = failed = int(time.time() * 1000)
            deadline_s = time.monotonic() + FAILOVER_WAIT_S_MAX
            commits: list[tuple[int, tuple[int, ...]]] = []
            while time.monotonic() < deadline_s:
                objects = await metadata.list_objects([ObjectState.COMMITTED])
                placed = await metadata.placements([o.object_id for o in objects])
                commits = [(o.committed_at_ms, placed.get(o.object_id, (0,))) for o in objects]
                if any(at >= failed and 1 in buckets for at, buckets in commits):
                    await asyncio.sleep(1.0)  # appends go on a while during the outage
                    break
                await asyncio.sleep(0.1)
        finally:
            stop.set()
            await appender
        return failover_result(failed_at_ms=failed, commits=commits, standby=1, stall_ms_max=stall_ms_max)
    finally:
        await asyncio.to_thread(primary.heal)
        await client.close()


async def run(ctx: Context) -> list[Result]:
    if ctx.s3 is None:
        ctx.notes.append("buckets: skipped (needs an S3 target: the fault proxies forward HTTP)")
        return []
    target = ctx.s3
    rate_mib_s = ctx.param("rate_mib_s", RATE_MIB_S_DEFAULT)
    total_bytes = ctx.param("total_mib", ctx.scale(quick=32, full=96)) * MiB
    record_bytes = 64 * 1024
    proxies = [FaultProxy.start(target.endpoint) for _ in range(2)]
    try:

        def bucket_list(name: str, count: int) -> str:
            prefix = ctx.key_prefix(f"{WORKLOAD}-{name}")
            return ",".join(
                bucket_uri(target, proxies[i].endpoint, f"{prefix}b{i}/", i) for i in range(count)
            )

        for proxy in proxies:
            await asyncio.to_thread(proxy.throttle, int(rate_mib_s * MiB))
        timeout = {
            "data_buckets_request_timeout_ms": THROUGHPUT_REQUEST_TIMEOUT_MS,
            "upload_inflight_max": ctx.param("inflight", UPLOAD_INFLIGHT_MAX),
        }
        ctx.status(f"buckets: warm-up through both proxies at {rate_mib_s:g} MiB/s")
        await _upload_run(
            ctx.scratch("warmup"), bucket_list("warmup", 2), _config("round_robin", **timeout),
            total_bytes=8 * MiB, record_bytes=record_bytes,
        )  # fmt: skip
        runs: dict[str, Run] = {}
        sent: dict[str, list[int]] = {}
        """Request body bytes each bucket's proxy forwarded during each run."""
        for name, count, strategy in (
            ("single", 1, "round_robin"),
            ("round_robin", 2, "round_robin"),
            ("replication", 2, "replication"),
        ):
            ctx.status(f"buckets: {name} over {count} bucket(s), {total_bytes // MiB} MiB")
            before = [(await asyncio.to_thread(p.state))["bytes_up"] for p in proxies]
            runs[name] = await _upload_run(
                ctx.scratch(name), bucket_list(name, count), _config(strategy, **timeout),
                total_bytes=total_bytes, record_bytes=record_bytes,
            )  # fmt: skip
            after = [(await asyncio.to_thread(p.state))["bytes_up"] for p in proxies]
            sent[name] = [b - a for a, b in zip(before, after, strict=True)][:count]
        results = throughput_results(
            single=runs["single"],
            round_robin=runs["round_robin"],
            replication=runs["replication"],
            rate_mib_s=rate_mib_s,
            extra={"payload_bytes": total_bytes, "record_bytes": record_bytes, "bytes_up_per_bucket": sent},
        )
        for proxy in proxies:
            await asyncio.to_thread(proxy.heal)
        ctx.status("buckets: failover, metadata in the data dir (SQLite, its copy in the buckets)")
        sqlite = await _failover_run(
            ctx, ctx.scratch("failover"), bucket_list("failover", 2), proxies[0], rate_bytes_per_s=2 * MiB
        )
        results.append(sqlite)
        ctx.status("buckets: failover, metadata in PostgreSQL")
        async with pg_schema(resolve_pg_url(ctx.metadata_url, ctx.status), "buckets") as url:
            shared = await _failover_run(
                ctx,
                ctx.scratch("failover-pg"),
                bucket_list("failover-pg", 2),
                proxies[0],
                rate_bytes_per_s=2 * MiB,
                metadata_url=url,
            )
        shared.metric = shared.metric.replace("(s)", "(s), metadata in PostgreSQL")
        sqlite.metric = sqlite.metric.replace("(s)", "(s), metadata in SQLite + its copy in the buckets")
        results.append(shared)
        return results
    finally:
        for proxy in proxies:
            await asyncio.to_thread(proxy.stop)
