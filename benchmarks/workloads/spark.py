"""Workload ``spark``: the Structured Streaming sink vs Spark's built-in parquet file sink.

Both sinks consume the **same micro-batches**: a directory of parquet files (pre-generated, one file
per micro-batch, ``maxFilesPerTrigger=1``) of rows with a random 1 KiB ``value``, a 16-byte ``key``
and a ``timestamp``. Local Spark (``local[2]``), the engine on its embedded default (WAL + local
objects + SQLite under the work dir).

- **rows/s**: rows / summed ``triggerExecution`` time of the measured micro-batches (the first one,
  with the query's start-up, is excluded), s3stream sink (``foreachBatch(S3StreamSink)``, exactly
  once, 4 partitions by key hash) vs ``writeStream.format("parquet")`` (Spark's file sink with its
  own exactly-once manifest). Goal ratio >= 1.0.
- **fixed cost per micro-batch**: mean ``triggerExecution`` of micro-batches of 10 rows, same two
  sinks (lower is better).

With an S3 target two more rows (the direct path needs objects the executors reach):

- **direct rows/s**: the same micro-batches through the sink's direct path (executors upload,
  the driver commits) vs the parquet sink; the extras give the driver path on the same bucket
  (``driver_path_s3_rows_per_s``) and on the embedded local store (``driver_path_local_rows_per_s``).
- **driver peak RSS of a big micro-batch** (``--param big_mib=N``; 2 GiB, 512 MiB with ``--quick``)
  on the direct path with ``spark.driver.memory=1g``, in its own driver process
  (``_spark_big_batch``): its ``VmHWM`` after the big batch vs after an empty batch (goal: below
  1.5x; the peak after a 1,000-row batch is in the extras). In local mode the executors run in the driver's JVM, so the JVM's peak is given apart.

CPU s/GiB (of 1 KiB values) of each sink: this process's CPU plus its children's (the JVM, where
Spark and its executors run) over the whole query, its first micro-batch included.

The extras break the sink's time down into executor encoding + collection (``encode_ms``) and the
engine appends (``append_ms``) per micro-batch.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.core import Context, Result
from benchmarks.measure import ResourceMeter, ResourceUsage, per_gib

KiB = 1 << 10
PARTITIONS = 4


def _generate(spark: Any, path: Path, *, files: int, rows_per_file: int, value_bytes: int) -> None:
    from pyspark.sql import functions as F

    hex_chars = value_bytes * 2
    digests = (hex_chars + 127) // 128
    value_hex = F.concat(
        *[F.sha2(F.concat(F.col("id").cast("string"), F.lit(f"/{i}")), 512) for i in range(digests)]
    )
    df = spark.range(0, files * rows_per_file, numPartitions=files).select(
        F.substring(F.sha2(F.col("id").cast("string"), 256), 1, 16).alias("key"),
        F.unhex(F.substring(value_hex, 1, hex_chars)).alias("value"),
        F.timestamp_millis(F.lit(1_700_000_000_000) + F.col("id")).alias("timestamp"),
    )
    df.write.mode("overwrite").parquet(str(path))


def _source(spark: Any, path: Path) -> Any:
    return (
        spark.readStream.schema("key string, value binary, timestamp timestamp")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(path))
    )


def _trigger_ms(query: Any) -> list[float]:
    return [float(p["durationMs"]["triggerExecution"]) for p in query.recentProgress if p["numInputRows"] > 0]


def _run_s3stream(
    spark: Any,
    src: Path,
    work: Path,
    *,
    bucket_uri: str | None = None,
    direct: bool | None = None,
    name: str = "s3stream",
    direct_history: list[Any] | None = None,
) -> tuple[list[float], list[int], Any]:
    from spark_sink.sink import S3StreamSink

    engine = work / f"engine-{name}"
    with S3StreamSink(
        engine, bucket_uri=bucket_uri, direct=direct, topic="bench", partitions=PARTITIONS
    ) as sink:
        query = (
            _source(spark, src)
            .writeStream.foreachBatch(sink)
            .trigger(availableNow=True)
            .option("checkpointLocation", str(work / f"ckpt-{name}"))
            .start()
        )
        query.awaitTermination()
        history = list(sink.history)
        if direct_history is not None:
            direct_history.extend(sink.direct_history)
        rows = [int(p["numInputRows"]) for p in query.recentProgress if p["numInputRows"] > 0]
        return _trigger_ms(query), rows, history


def _run_parquet(spark: Any, src: Path, work: Path) -> tuple[list[float], list[int]]:
    query = (
        _source(spark, src)
        .writeStream.format("parquet")
        .option("path", str(work / "parquet-out"))
        .trigger(availableNow=True)
        .option("checkpointLocation", str(work / "ckpt-parquet"))
        .start()
    )
    query.awaitTermination()
    rows = [int(p["numInputRows"]) for p in query.recentProgress if p["numInputRows"] > 0]
    return _trigger_ms(query), rows


def _run_foreach_noop(spark: Any, src: Path, work: Path) -> list[float]:
    """A foreachBatch that writes nothing (``df.write.format("noop")``): Spark + Python callback cost."""

    def write(df: Any, batch_id: int) -> None:
        df.write.format("noop").mode("overwrite").save()

    query = (
        _source(spark, src)
        .writeStream.foreachBatch(write)
        .trigger(availableNow=True)
        .option("checkpointLocation", str(work / "ckpt-noop"))
        .start()
    )
    query.awaitTermination()
    return _trigger_ms(query)


def _measure(ctx: Context) -> list[Result]:
    from spark_sink.session import local_session

    files = 4 if ctx.quick else 6
    rows_per_file = 20_000 if ctx.quick else 100_000
    small_files = 5 if ctx.quick else 10
    work = ctx.work_dir / "spark"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    spark = local_session("s3stream-bench")
    try:
        t0 = time.perf_counter()
        _generate(spark, work / "in", files=files, rows_per_file=rows_per_file, value_bytes=KiB)
        _generate(spark, work / "small", files=small_files, rows_per_file=10, value_bytes=KiB)
        ctx.notes.append(f"spark: generated inputs in {time.perf_counter() - t0:.1f} s")

        # order: parquet first warms the JVM's file source for both; each sink gets its own checkpoint
        usage: dict[str, ResourceUsage] = {}
        with ResourceMeter() as meter:
            pq_ms, pq_rows = _run_parquet(spark, work / "in", work / "big")
        usage["parquet"] = meter.usage
        with ResourceMeter() as meter:
            s3_ms, s3_rows, history = _run_s3stream(spark, work / "in", work / "big")
        usage["s3stream"] = meter.usage
        direct: dict[str, Any] = {}
        direct_stats: list[Any] = []
        if ctx.s3 is not None:  # the direct path needs objects the executors reach: S3
            for label, use_direct in (("direct", True), ("driver_path_s3", False)):
                uri = ctx.s3.uri(ctx.key_prefix(f"spark-{label}"))
                with ResourceMeter() as meter:
                    ms, rows, hist = _run_s3stream(
                        spark,
                        work / "in",
                        work / "big",
                        bucket_uri=uri,
                        direct=use_direct,
                        name=label,
                        direct_history=direct_stats if use_direct else None,
                    )
                usage[label] = meter.usage
                direct[label] = (ms, rows, hist)
        pq_small_ms, _ = _run_parquet(spark, work / "small", work / "small-run")
        s3_small_ms, _, small_history = _run_s3stream(spark, work / "small", work / "small-run")
        noop_small_ms = _run_foreach_noop(spark, work / "small", work / "small-run")
        noop_ms = _run_foreach_noop(spark, work / "in", work / "big")
    finally:
        spark.stop()

    def rate(ms: list[float], rows: list[int]) -> float:
        return sum(rows[1:]) / (sum(ms[1:]) / 1000) if len(ms) > 1 else float("nan")

    def cpu(side: str, rows: list[int]) -> float:
        return per_gib(usage[side].cpu_s, sum(rows) * KiB)

    s3_rate = rate(s3_ms, s3_rows)
    pq_rate = rate(pq_ms, pq_rows)
    measured = history[1:]
    extra: dict[str, Any] = {
        "rows_per_microbatch": rows_per_file,
        "microbatches_measured": len(s3_ms) - 1,
        "value_bytes": KiB,
        "partitions": PARTITIONS,
        "s3stream_trigger_ms": s3_ms,
        "foreachbatch_noop_rows_per_s": rate(noop_ms, pq_rows),
        "parquet_trigger_ms": pq_ms,
        "encode_ms_mean": 1000 * statistics.fmean(h.encode_s for h in measured) if measured else None,
        "prepare_ms_mean": 1000 * statistics.fmean(h.prepare_s for h in measured) if measured else None,
        "append_ms_mean": 1000 * statistics.fmean(h.append_s for h in measured) if measured else None,
        "chunks_per_microbatch": [h.chunks for h in measured],
        "payload_mib_per_microbatch": [round(h.bytes_written / (1 << 20), 1) for h in measured],
    }
    results: list[Result] = []
    if direct:
        d_ms, d_rows, _ = direct["direct"]
        w_ms, w_rows, _ = direct["driver_path_s3"]
        results.append(
            Result(
                workload="spark",
                metric="direct_rows_per_s_1KiB",
                value=rate(d_ms, d_rows),
                unit="rows/s",
                baseline="Spark parquet file sink, same micro-batches",
                baseline_value=pq_rate,
                extra={
                    "driver_path_s3_rows_per_s": rate(w_ms, w_rows),
                    "driver_path_local_rows_per_s": s3_rate,
                    "direct_trigger_ms": d_ms,
                    "driver_path_s3_trigger_ms": w_ms,
                    "parquet_trigger_ms": pq_ms,
                    # per micro-batch: the count pass (persist + aggregation), the write pass, the commit
                    "direct_count_ms": [round(h.count_s * 1000) for h in direct_stats],
                    "direct_write_ms": [round(h.write_s * 1000) for h in direct_stats],
                    "direct_commit_ms": [round(h.commit_s * 1000) for h in direct_stats],
                    "load_average": list(os.getloadavg()),
                    "driver_path_s3_cpu_s_per_gib": cpu("driver_path_s3", w_rows),
                },
                cpu_s_per_gib=cpu("direct", d_rows),
                baseline_cpu_s_per_gib=cpu("parquet", pq_rows),
            )
        )
        results.append(_driver_rss(ctx))
    return [
        *results,
        Result(
            workload="spark",
            metric="rows_per_s_1KiB",
            value=s3_rate,
            unit="rows/s",
            baseline="Spark parquet file sink, same micro-batches",
            baseline_value=pq_rate,
            extra=extra,
            cpu_s_per_gib=cpu("s3stream", s3_rows),
            baseline_cpu_s_per_gib=cpu("parquet", pq_rows),
        ),
        Result(
            workload="spark",
            metric="fixed_ms_per_microbatch",
            value=statistics.fmean(s3_small_ms[1:]),
            unit="ms",
            baseline="Spark parquet file sink, 10-row micro-batches",
            baseline_value=statistics.fmean(pq_small_ms[1:]),
            higher_is_better=False,
            extra={
                "s3stream_ms": s3_small_ms,
                "parquet_ms": pq_small_ms,
                "foreachbatch_noop_ms": noop_small_ms,
                "encode_ms": [round(h.encode_s * 1000, 1) for h in small_history],
                "append_ms": [round(h.append_s * 1000, 1) for h in small_history],
            },
        ),
    ]


def _driver_rss(ctx: Context) -> Result:
    """Driver peak RSS for a big micro-batch on the direct path (a subprocess per run: its own JVM)."""
    import json
    import subprocess
    import sys

    assert ctx.s3 is not None
    mib = ctx.param("big_mib", ctx.scale(quick=512, full=2048))
    out: dict[str, Any] = {}
    for label, direct in (("direct", "true"),):
        args = [
            sys.executable,
            "-m",
            "benchmarks.workloads._spark_big_batch",
            "--data-dir",
            str(ctx.scratch(f"spark-big-{label}")),
            "--bucket-uri",
            ctx.s3.uri(ctx.key_prefix(f"spark-big-{label}")),
            "--mib",
            str(mib),
            "--driver-memory",
            "1g",
            "--direct",
            direct,
        ]
        proc = subprocess.run(args, capture_output=True, text=True, check=True, timeout=7200)
        out[label] = json.loads(proc.stdout.strip().splitlines()[-1])
    d = out["direct"]
    return Result(
        workload="spark",
        metric="driver_peak_rss_big_batch",
        value=d["driver_peak_rss_big_bytes"] / (1 << 20),
        unit="MiB",
        baseline=f"the same driver's peak after an empty micro-batch (goal: big < 1.5x); batch {mib} MiB",
        baseline_value=d["driver_peak_rss_empty_bytes"] / (1 << 20),
        higher_is_better=False,
        extra={
            "driver_peak_rss_after_1000_rows_mib": d["driver_peak_rss_small_bytes"] / (1 << 20),
            "big_batch_s": d["big_s"],
            "jvm_peak_rss_mib": (d["jvm_peak_rss_bytes"] or 0) / (1 << 20),
            "mib": mib,
        },
    )


async def run(ctx: Context) -> list[Result]:
    from benchmarks.workloads._spark_source import measure_source

    return await asyncio.to_thread(_measure, ctx) + await asyncio.to_thread(measure_source, ctx)
