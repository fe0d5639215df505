"""A Structured Streaming driver for the crash tests: rate-micro-batch rows into a topic, exactly once.

Run as a subprocess (``python tests/spark/stream_job.py --data-dir D --checkpoint C ...``); the tests
SIGKILL it (from outside, or with ``--kill-at STEP``: the sink's progress observer SIGKILLs the driver
when the sink reports that step, ``after_chunk:<batch>:<chunk>`` or ``after_batch:<batch>``) and run it
again from the same checkpoint. Each micro-batch the sink finished is printed as a JSON line
``{"event": "batch", "batch_id": N, ...}`` to stdout; ``{"event": "stopped"}`` after a clean stop.

Row ``i`` (the rate source's ``value``, 0, 1, 2, ... across micro-batches) becomes a record with
key ``str(i)``, a value of ``--value-bytes`` bytes starting with ``str(i)``, and goes to partition
``i % partitions``; so the verifier can find duplicates and gaps.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any


def killer_at(kill_at: str | None) -> Callable[[str], None]:
    """A sink progress observer that SIGKILLs this process when the sink reports step ``kill_at``."""

    def observe(step: str) -> None:
        if step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    return observe


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--topic", default="rate")
    parser.add_argument("--rows-per-batch", type=int, default=300)
    parser.add_argument("--until-batch", type=int, required=True, help="stop after this batch id is written")
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--value-bytes", type=int, default=200)
    parser.add_argument("--chunk-max-bytes", type=int, default=None)
    parser.add_argument("--batch-bytes-target", type=int, default=1 << 20)
    parser.add_argument("--timeout-s", type=float, default=120)
    parser.add_argument("--kill-at", default=None, help="SIGKILL the driver when the sink reports this step")
    args = parser.parse_args(argv)

    from pyspark.sql import functions as F

    from s3stream.config import Config
    from spark_sink.session import local_session
    from spark_sink.sink import S3StreamSink

    spark = local_session("s3stream-stream-job")
    config = Config()
    sink = S3StreamSink(
        args.data_dir,
        config=config,
        topic=args.topic,
        partitions=args.partitions,
        stream_column="partition",
        chunk_max_bytes=args.chunk_max_bytes,
        batch_bytes_target=args.batch_bytes_target,
        record_max_bytes=max(4096, args.value_bytes * 2),
        progress_observer=killer_at(args.kill_at),
    )
    done = threading.Event()

    def write(df: Any, batch_id: int) -> None:
        sink(df, batch_id)
        stats = sink.history[-1]
        line = {
            "event": "batch",
            "batch_id": batch_id,
            "rows": stats.rows,
            "chunks": stats.chunks,
            "chunks_written": stats.chunks_written,
        }
        print(json.dumps(line), flush=True)
        if batch_id >= args.until_batch:
            done.set()

    source = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", args.rows_per_batch)
        .option("numPartitions", 2)
        .option("startTimestamp", 1_700_000_000_000)
        .option("advanceMillisPerBatch", 1000)
        .load()
    )
    pad = "x" * max(0, args.value_bytes)
    rows = source.select(
        F.col("value").cast("string").alias("key"),
        F.substring(F.concat(F.col("value").cast("string"), F.lit(":" + pad)), 1, args.value_bytes).alias(
            "value"
        ),
        F.col("timestamp"),
        (F.col("value") % args.partitions).cast("int").alias("partition"),
    )
    query = rows.writeStream.foreachBatch(write).option("checkpointLocation", args.checkpoint).start()
    deadline = time.monotonic() + args.timeout_s
    try:
        while not done.wait(0.1):
            if not query.isActive:
                query.awaitTermination()  # raises the query's exception
                return 1
            if time.monotonic() > deadline:
                print(json.dumps({"event": "timeout"}), flush=True)
                return 3
    finally:
        query.stop()
        sink.close()
    print(json.dumps({"event": "stopped"}), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
