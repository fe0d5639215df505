"""Part of workload ``spark``: the ``s3stream`` Spark source vs Spark reading parquet and vs ``read_topic``.

The same rows (random 1 KiB ``value``, 16-byte ``key``) are first written by the sink into a topic
of 4 partitions (the engine on the embedded default with local objects, or on the ``--s3`` bucket),
and as parquet files (the source's columns). Then each reader's rows go to Spark's ``noop`` sink:

- **source rows/s**: ``spark.read.format("s3stream")`` (executors fetch and decode; the driver
  plans from metadata only); the streaming form (``readStream`` with ``Trigger.AvailableNow``) is
  in the extras;
- baselines: ``spark.read.parquet`` of the same rows (report), and :func:`spark_sink.reader.read_topic`
  (payloads fetched on the driver, decoded on executors; goal: the source >= 2x).

Each reader runs twice; the faster run counts (the first warms the JVM and the Python workers).
"""

from __future__ import annotations

import shutil
import time
from typing import Any

from benchmarks.core import Context, Result

KiB = 1 << 10
PARTITIONS = 4
TOPIC = "bench"


def _rows(spark: Any, first: int, count: int, value_bytes: int) -> Any:
    from pyspark.sql import functions as F

    hex_chars = value_bytes * 2
    digests = (hex_chars + 127) // 128
    value_hex = F.concat(
        *[F.sha2(F.concat(F.col("id").cast("string"), F.lit(f"/{i}")), 512) for i in range(digests)]
    )
    return spark.range(first, first + count, numPartitions=4).select(
        F.substring(F.sha2(F.col("id").cast("string"), 256), 1, 16).alias("key"),
        F.unhex(F.substring(value_hex, 1, hex_chars)).alias("value"),
        (F.col("id") % PARTITIONS).cast("int").alias("partition"),
    )


def _best_s(run: Any, repeats: int = 2) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t0)
    return best


def measure_source(ctx: Context) -> list[Result]:
    from s3stream.assembly import open_sync
    from s3stream.config import Config
    from spark_sink.reader import read_topic
    from spark_sink.session import local_session
    from spark_sink.sink import S3StreamSink
    from spark_sink.source import S3StreamDataSource
    from spark_sink.worker_start import is_worker_start_timeout

    rows_total = 50_000 if ctx.quick else 200_000
    batches = 2 if ctx.quick else 4
    work = ctx.work_dir / "spark-source"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    engine = (work / "engine").resolve()
    bucket_uri = (
        ctx.s3.uri(f"bench/{ctx.run_id}/spark-source/")
        if ctx.s3 is not None
        else (engine / "objects").as_uri()
    )
    config = Config.from_sources(env={})
    spark = local_session("s3stream-bench-source")
    spark.dataSource.register(S3StreamDataSource)
    try:
        ctx.status("spark source: writing the topic")
        per_batch = rows_total // batches
        with S3StreamSink(
            engine,
            bucket_uri=bucket_uri if ctx.s3 is not None else None,
            config=config,
            topic=TOPIC,
            partitions=PARTITIONS,
            stream_column="partition",
            query_id="bench",
        ) as sink:
            for b in range(batches):
                sink(_rows(spark, b * per_batch, per_batch, KiB).persist(), b)
        options = {
            "topic": TOPIC,
            "metadataUrl": "sqlite://" + str(engine / "metadata.db"),
            "bucketUri": bucket_uri,
        }
        source = spark.read.format("s3stream").options(**options).load()
        source.write.parquet(str(work / "parquet"))
        count = source.count()

        ctx.status("spark source: s3stream source")
        source_s = _best_s(
            lambda: (
                spark.read.format("s3stream")
                .options(**options)
                .load()
                .write.format("noop")
                .mode("overwrite")
                .save()
            )
        )

        def stream_once() -> None:
            from pyspark.errors import StreamingQueryException

            for attempt in range(3):
                shutil.rmtree(work / "ckpt", ignore_errors=True)
                query = (
                    spark.readStream.format("s3stream")
                    .options(**options, startingOffsets="earliest")
                    .load()
                    .writeStream.format("noop")
                    .option("checkpointLocation", str(work / "ckpt"))
                    .trigger(availableNow=True)
                    .start()
                )
                try:
                    query.awaitTermination()
                    return
                except StreamingQueryException as exc:
                    # the driver's Python source worker missed Spark's start window (10 s)
                    if not is_worker_start_timeout(exc) or attempt == 2:
                        raise

        ctx.status("spark source: parquet")
        parquet_s = _best_s(
            lambda: spark.read.parquet(str(work / "parquet")).write.format("noop").mode("overwrite").save()
        )
        ctx.status("spark source: read_topic")
        read_topic_s = float("inf")
        for _ in range(2):  # a client opens a topic's streams once: a new client per run
            client = open_sync(engine, bucket_uri=bucket_uri if ctx.s3 is not None else None, config=config)
            try:
                read_topic_s = min(
                    read_topic_s,
                    _best_s(
                        lambda c=client: (
                            read_topic(spark, c, TOPIC).write.format("noop").mode("overwrite").save()
                        ),
                        repeats=1,
                    ),
                )
            finally:
                client.close()
        ctx.notes.append(
            f"spark source: {count} rows, source {source_s:.2f} s, parquet {parquet_s:.2f} s, read_topic {read_topic_s:.2f} s"
        )
        ctx.status("spark source: s3stream source, streaming")
        stream_s = _best_s(stream_once)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    source_rate = count / source_s
    extra = {
        "rows": count,
        "value_bytes": KiB,
        "partitions": PARTITIONS,
        "source_s": source_s,
        "source_streaming_available_now_rows_per_s": count / stream_s,
        "parquet_s": parquet_s,
        "read_topic_s": read_topic_s,
        "objects": "s3" if ctx.s3 is not None else "local directory",
    }
    return [
        Result(
            workload="spark",
            metric="source_rows_per_s_vs_parquet",
            value=source_rate,
            unit="rows/s",
            baseline="spark.read.parquet of the same rows",
            baseline_value=count / parquet_s,
            extra=extra,
        ),
        Result(
            workload="spark",
            metric="source_rows_per_s_vs_read_topic",
            value=source_rate,
            unit="rows/s",
            baseline="read_topic (driver fetch, executor decode)",
            baseline_value=count / read_topic_s,
            extra=extra,
        ),
    ]
