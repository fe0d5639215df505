"""The demo job: a Structured Streaming query ingesting into s3stream, then reading back what was stored.

``run_demo(data_dir)`` (called by ``s3stream demo`` / the README's main job):

1. opens the engine on its embedded default under ``data_dir/engine`` (WAL file, local objects, SQLite);
2. runs a Structured Streaming query (``rate-micro-batch`` source, JSON "events" keyed by user) for a
   few micro-batches through :class:`~spark_sink.sink.S3StreamSink` into topic ``demo`` (3 partitions,
   key-hash routing), checkpoint under ``data_dir/checkpoint`` -- a second run continues from there;
3. reads the topic back into a DataFrame with :func:`~spark_sink.reader.read_topic` and shows it:
   rows per partition, offsets, a sample, and the check that every row Spark committed is stored
   exactly once;
4. streams the topic out again while step 2 runs: a second Structured Streaming query reads it with
   the ``s3stream`` source (:class:`~spark_sink.source.S3StreamDataSource`, a reader of the engine's
   metadata and objects beside the writer) into parquet files under ``data_dir/out``, checkpoint
   ``data_dir/checkpoint-out``; once the writer is closed it catches up, and the parquet files must
   hold exactly the stored records. A query that fails only because its Python source worker missed
   Spark's start window (:mod:`spark_sink.worker_start`) is restarted from its checkpoint.

Returns 0 when the stored rows are exactly the committed micro-batches and the streamed-out rows
are exactly the stored ones, 1 otherwise.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

TOPIC = "demo"
PARTITIONS = 3
ROWS_PER_BATCH = 500
BATCHES_PER_RUN = 4
UPLOAD_INTERVAL_MS = 500
"""The demo engine uploads its WAL blocks this soon, so the streaming-out query sees them quickly."""


def _events(spark: Any) -> Any:
    from pyspark.sql import functions as F

    source = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", ROWS_PER_BATCH)
        .option("numPartitions", 2)
        .option("startTimestamp", 1_700_000_000_000)
        .option("advanceMillisPerBatch", 1000)
        .load()
    )
    user = F.concat(F.lit("user-"), (F.col("value") % 37).cast("string"))
    body = F.to_json(
        F.struct(
            F.col("value").alias("seq"),
            user.alias("user"),
            F.element_at(
                F.array(F.lit("view"), F.lit("click"), F.lit("buy")), (F.col("value") % 3 + 1).cast("int")
            ).alias("action"),
        )
    )
    return source.select(
        user.alias("key"),
        body.alias("value"),
        F.col("timestamp"),
        F.array(F.struct(F.lit("source").alias("key"), F.lit(b"rate-micro-batch").alias("value"))).alias(
            "headers"
        ),
    )


def _committed_batches(checkpoint: Path) -> int:
    commits = checkpoint / "commits"
    if not commits.is_dir():
        return 0
    ids = [int(p.name) for p in commits.iterdir() if p.name.isdigit()]
    return max(ids) + 1 if ids else 0


def run_demo(data_dir: str | os.PathLike[str]) -> int:
    from pyspark.sql import functions as F

    from s3stream.config import Config
    from spark_sink.reader import read_topic
    from spark_sink.session import local_session
    from spark_sink.sink import S3StreamSink
    from spark_sink.source import S3StreamDataSource

    root = Path(data_dir)
    root.mkdir(parents=True, exist_ok=True)
    checkpoint = root / "checkpoint"
    print(f"s3stream demo: engine at {root / 'engine'} (embedded default), checkpoint at {checkpoint}")
    started = time.monotonic()
    spark = local_session("s3stream-demo")
    print(f"  Spark {spark.version} local session ready in {time.monotonic() - started:.1f} s")
    first = _committed_batches(checkpoint)
    target = first + BATCHES_PER_RUN
    done = threading.Event()
    spark.dataSource.register(S3StreamDataSource)
    engine = (root / "engine").resolve()
    out_query: Any = None
    try:
        config = Config.from_sources(wal_upload_interval_ms=UPLOAD_INTERVAL_MS)
        with S3StreamSink(engine, topic=TOPIC, partitions=PARTITIONS, config=config) as sink:

            def write(df: Any, batch_id: int) -> None:
                sink(df, batch_id)
                s = sink.history[-1]
                print(
                    f"  micro-batch {batch_id}: {s.rows} rows -> {s.payloads} Kafka batches in {s.chunks} "
                    f"atomic append(s), {s.bytes_written / 1024:.0f} KiB "
                    f"(encode {s.encode_s * 1000:.0f} ms, append {s.append_s * 1000:.0f} ms)"
                    + ("" if s.chunks_written == s.chunks else " [replay: already stored, skipped]")
                )
                if batch_id + 1 >= target:
                    done.set()

            query = (
                _events(spark)
                .writeStream.foreachBatch(write)
                .option("checkpointLocation", str(checkpoint))
                .start()
            )
            while not done.wait(0.2):
                if not query.isActive:
                    query.awaitTermination()
                if out_query is None and sink.history:  # the topic exists: stream it out meanwhile
                    out_query = _stream_out(spark, engine, root)
            query.stop()
            if out_query is None:
                out_query = _stream_out(spark, engine, root)
            committed = _committed_batches(checkpoint)

            stored = read_topic(spark, sink, TOPIC).cache()
            total = stored.count()
            print(f"\nread back topic {TOPIC!r}: {total} records")
            stored.groupBy("partition").agg(
                F.count("*").alias("records"),
                F.min("offset").alias("first_offset"),
                F.max("offset").alias("last_offset"),
            ).orderBy("partition").show()
            stored.select(
                "partition",
                "offset",
                "timestamp",
                F.col("key").cast("string").alias("key"),
                F.col("value").cast("string").alias("value"),
            ).orderBy("timestamp", "partition", "offset").show(8, truncate=False)
            distinct = (
                stored.select(F.get_json_object(F.col("value").cast("string"), "$.seq")).distinct().count()
            )
            stored.unpersist()
        # the sink is closed: every committed record is uploaded, so the second query catches up
        out_query = _catch_up(spark, engine, root, out_query)
        streamed = spark.read.parquet(str(root / "out"))
        streamed_total = streamed.count()
        streamed_distinct = streamed.select("partition", "offset").distinct().count()
        print(
            f"\nstreamed topic {TOPIC!r} out with the s3stream source into {root / 'out'}: "
            f"{streamed_total} records, {streamed_distinct} distinct (partition, offset)"
        )
        streamed.groupBy("partition").count().orderBy("partition").show()
    finally:
        if out_query is not None and out_query.isActive:
            out_query.stop()
        spark.stop()
    expected_low, expected_high = committed * ROWS_PER_BATCH, (committed + 1) * ROWS_PER_BATCH
    ok = distinct == total and expected_low <= total <= expected_high and total % ROWS_PER_BATCH == 0
    print(
        f"Spark committed {committed} micro-batches ({committed * ROWS_PER_BATCH} rows); the engine holds "
        f"{total} records, {distinct} distinct: " + ("exactly once." if ok else "MISMATCH")
    )
    if ok and total > committed * ROWS_PER_BATCH:
        print(
            f"  (micro-batch {committed} reached the engine but the query stopped before Spark's commit: "
            "the next run replays it and the sink skips it)"
        )
    streamed_ok = streamed_total == total == streamed_distinct
    print(
        f"the streaming read holds {streamed_total} of the {total} stored records: "
        + ("exactly the stored records." if streamed_ok else "MISMATCH")
    )
    return 0 if ok and streamed_ok else 1


def _catch_up(spark: Any, engine: Path, root: Path, query: Any) -> Any:
    """Let the streaming-out query process everything, then stop it; a query that failed only
    because its Python source worker missed Spark's start window is started again from its
    checkpoint (at most ``WORKER_START_ATTEMPTS`` runs). Returns the last query run."""
    from pyspark.errors import StreamingQueryException

    from spark_sink.worker_start import WORKER_START_ATTEMPTS, is_worker_start_timeout

    for attempt in range(1, WORKER_START_ATTEMPTS + 1):
        try:
            query.processAllAvailable()
            query.stop()
            return query
        except StreamingQueryException as exc:
            if not is_worker_start_timeout(exc) or attempt == WORKER_START_ATTEMPTS:
                raise
            print(
                f"  the streaming-out query's Python worker started too slowly (attempt {attempt}): "
                "restarting it from its checkpoint"
            )
            query = _stream_out(spark, engine, root)
    raise AssertionError("unreachable")


def _stream_out(spark: Any, engine: Path, root: Path) -> Any:
    """Start the second query: topic ``demo`` read by the ``s3stream`` source, written to parquet."""
    return (
        spark.readStream.format("s3stream")
        .option("topic", TOPIC)
        .option("metadataUrl", "sqlite://" + str(engine / "metadata.db"))
        .option("bucketUri", (engine / "objects").as_uri())
        .option("startingOffsets", "earliest")
        .load()
        .writeStream.format("parquet")
        .option("path", str(root / "out"))
        .option("checkpointLocation", str(root / "checkpoint-out"))
        .trigger(processingTime="1 second")
        .start()
    )
