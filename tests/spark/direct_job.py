"""A Structured Streaming driver on the sink's direct path, for the crash tests (run as a subprocess).

``python tests/spark/direct_job.py --data-dir D --bucket-uri U --checkpoint C --until-batch N ...``:
rate-micro-batch rows (row ``i``: key ``str(i)``, partition ``i % partitions``) into a topic whose
objects are on S3, so the sink takes the direct path. Ways to die or misbehave:

- ``--kill-at STEP``: the sink's progress observer SIGKILLs the driver at ``after_count:<b>``,
  ``after_prepare:<b>``, ``after_upload:<b>``, ``before_commit:<b>``, ``after_batch:<b>``;
- ``--kill-inside-commit B``: the driver SIGKILLs itself inside micro-batch B's metadata transaction,
  after its statements ran and before COMMIT (the controller function of ``commit_objects`` is wrapped
  in this process: the hook sits between BEGIN and COMMIT, no branch in the product code);
- ``--kill-during-upload B``: task 0's executor process SIGKILLs the driver right after its upload of
  micro-batch B (other tasks may still be uploading);
- ``--fail-after-upload``: attempt 0 of task 0 raises after its upload, every micro-batch (with
  ``--master local[2,4]`` Spark retries it; the retry writes another object);
- ``--slow-first-attempt S``: attempt 0 of task 1 sleeps S seconds after its upload (with speculation
  on, a speculative copy may finish first).

Each micro-batch the sink finished prints ``{"event": "batch", ...}``; ``{"event": "stopped"}`` at the end.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TaskFaults:
    """The task observer (pickled to the executors)."""

    driver_pid: int
    kill_during_upload: int
    fail_after_upload: bool
    slow_first_attempt_s: float

    def __call__(self, step: str, batch_id: int, task: int, attempt: int) -> None:
        if step != "after_upload":
            return
        if task == 0 and batch_id == self.kill_during_upload:
            os.kill(self.driver_pid, signal.SIGKILL)
        if task == 0 and attempt == 0 and self.fail_after_upload:
            raise RuntimeError("injected: task 0 attempt 0 fails after its upload")
        if task == 1 and attempt == 0 and self.slow_first_attempt_s:
            time.sleep(self.slow_first_attempt_s)


def killer_at(kill_at: str | None) -> Any:
    """A sink progress observer that SIGKILLs this process when the sink reports step ``kill_at``."""

    def observe(step: str) -> None:
        if step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    return observe


def _kill_inside_commit(batch_id: int) -> None:
    from s3stream.metadata import external_ops
    from spark_sink.direct_protocol import DirectProgress

    real = external_ops.commit_objects
    target = DirectProgress(batch_id).encode()

    def commit_objects(txn: Any, req: Any, *, now_ms: int) -> None:
        real(txn, req, now_ms=now_ms)
        if target in req.kv_puts.values():
            os.kill(os.getpid(), signal.SIGKILL)  # statements done, COMMIT not reached

    external_ops.commit_objects = commit_objects


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--bucket-uri", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--rows-per-batch", type=int, default=300)
    parser.add_argument("--until-batch", type=int, required=True)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--value-bytes", type=int, default=200)
    parser.add_argument("--timeout-s", type=float, default=180)
    parser.add_argument("--kill-at", default=None)
    parser.add_argument("--kill-inside-commit", type=int, default=-1)
    parser.add_argument("--kill-during-upload", type=int, default=-1)
    parser.add_argument("--fail-after-upload", action="store_true")
    parser.add_argument("--slow-first-attempt", type=float, default=0.0)
    parser.add_argument("--speculation", action="store_true")
    args = parser.parse_args(argv)
    faulthandler.dump_traceback_later(args.timeout_s * 0.9, exit=False)  # where a hung driver waits

    from pyspark.sql import functions as F

    from spark_sink.session import local_session
    from spark_sink.sink import S3StreamSink

    if args.kill_inside_commit >= 0:
        _kill_inside_commit(args.kill_inside_commit)
    conf = {}
    if args.speculation:
        conf = {
            "spark.speculation": "true",
            "spark.speculation.interval": "100ms",
            "spark.speculation.multiplier": "1.5",
            "spark.speculation.quantile": "0.5",
            "spark.speculation.minTaskRuntime": "100ms",
        }
    spark = local_session("s3stream-direct-job", master=args.master, conf=conf)
    sink = S3StreamSink(
        args.data_dir,
        bucket_uri=args.bucket_uri,
        topic="rate",
        partitions=args.partitions,
        stream_column="partition",
        batch_bytes_target=8192,
        record_max_bytes=max(4096, args.value_bytes * 2),
        progress_observer=killer_at(args.kill_at),
        task_observer=TaskFaults(
            os.getpid(), args.kill_during_upload, args.fail_after_upload, args.slow_first_attempt
        ),
    )
    done = threading.Event()

    def write(df: Any, batch_id: int) -> None:
        sink(df, batch_id)
        stats = sink.direct_history[-1]
        line = {"event": "batch", "batch_id": batch_id, "rows": stats.rows, "skipped": stats.skipped}
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
                query.awaitTermination()
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
