"""A Structured Streaming driver for the source crash tests: a topic read by ``s3stream``, written to parquet.

Run as a subprocess (``python tests/spark/source_job.py --metadata-url M --bucket-uri B --checkpoint C
--out O ...``). Each micro-batch is written by ``foreachBatch`` to ``O/batch=<id>`` (overwritten on a
replay, so the output is exactly once when the source replays the same records for the same batch
id) and printed as a JSON line ``{"event": "batch", "batch_id": N, "rows": R, "ranges": {...}}``.
``--kill-at-batch N`` SIGKILLs the driver after batch N's output is written, before Spark records
its commit. Without ``--kill-at-batch`` the job runs with ``Trigger.AvailableNow`` and exits 0 when
everything readable was processed (``{"event": "stopped"}``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from typing import Any


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--metadata-url", required=True)
    parser.add_argument("--bucket-uri", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--topic", default="t")
    parser.add_argument("--max-records", type=int, default=300)
    parser.add_argument("--kill-at-batch", type=int, default=None)
    args = parser.parse_args(argv)

    from pyspark.errors import StreamingQueryException
    from pyspark.sql import functions as F

    from spark_sink import S3StreamDataSource
    from spark_sink.session import local_session
    from spark_sink.worker_start import WORKER_START_ATTEMPTS, is_worker_start_timeout

    spark = local_session("s3stream-source-job")
    spark.dataSource.register(S3StreamDataSource)

    def write(df: Any, batch_id: int) -> None:
        df = df.persist()
        df.write.mode("overwrite").parquet(os.path.join(args.out, f"batch={batch_id}"))
        ranges = {
            str(r["partition"]): [r["lo"], r["hi"]]
            for r in df.groupBy("partition")
            .agg(F.min("offset").alias("lo"), F.max("offset").alias("hi"))
            .collect()
        }
        line = {"event": "batch", "batch_id": batch_id, "rows": df.count(), "ranges": ranges}
        df.unpersist()
        print(json.dumps(line), flush=True)
        if args.kill_at_batch is not None and batch_id >= args.kill_at_batch:
            os.kill(os.getpid(), signal.SIGKILL)

    stream = (
        spark.readStream.format("s3stream")
        .option("topic", args.topic)
        .option("bucketUri", args.bucket_uri)
        .option("metadataUrl", args.metadata_url)
        .option("startingOffsets", "earliest")
        .option("maxRecordsPerTrigger", args.max_records)
        .load()
    )
    writer = stream.writeStream.foreachBatch(write).option("checkpointLocation", args.checkpoint)
    if args.kill_at_batch is None:
        writer = writer.trigger(availableNow=True)
    for attempt in range(WORKER_START_ATTEMPTS):
        query = writer.start()
        try:
            query.awaitTermination()
            break
        except StreamingQueryException as exc:
            # the driver's Python source worker missed Spark's start window: the query restarts
            # from its checkpoint (nothing else is retried)
            if not is_worker_start_timeout(exc) or attempt == WORKER_START_ATTEMPTS - 1:
                raise
    print(json.dumps({"event": "stopped"}), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
