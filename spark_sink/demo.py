"""The demo job: a Structured Streaming query ingesting into s3stream, then reading back what was stored.

``run_demo(data_dir)`` (called by ``s3stream demo`` / the README's main job):

1. opens the engine on its embedded default under ``data_dir/engine`` (WAL file, local objects, SQLite);
2. runs a Structured Streaming query (``rate-micro-batch`` source, JSON "events" keyed by user) for a
   few micro-batches through :class:`~spark_sink.sink.S3StreamSink` into topic ``demo`` (3 partitions,
   key-hash routing), checkpoint under ``data_dir/checkpoint`` -- a second run continues from there;
3. reads the topic back into a DataFrame with :func:`~spark_sink.reader.read_topic` and shows it:
   rows per partition, offsets, a sample, and the check that every row Spark committed is stored
   exactly once.

Returns 0 when the stored rows are exactly the committed micro-batches, 1 otherwise.
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

    from spark_sink.reader import read_topic
    from spark_sink.session import local_session
    from spark_sink.sink import S3StreamSink

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
    try:
        with S3StreamSink(root / "engine", topic=TOPIC, partitions=PARTITIONS) as sink:

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
            query.stop()
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
    finally:
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
    return 0 if ok else 1
