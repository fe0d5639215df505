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
  on, a speculative copy may finish first; with ``--marker-dir``, a later attempt of task 1 starts its
  upload only once attempt 0's is done, at most S seconds later, so both attempts write);
- ``--kill-worker-mid-upload B``: the Python worker running task 0 of micro-batch B SIGKILLs itself
  right after the first part of its multipart upload is stored (the upload is started, not complete),
  once (an exclusive marker file in ``--marker-dir`` decides); Spark retries the task;
- ``--stop-at STEP``: the driver SIGSTOPs itself when the sink reports ``STEP`` (after printing
  ``{"event": "stopped_at", ...}``), for a zombie driver that the test resumes with SIGCONT.

``--node-lease-ms MS`` sets the engine's node lease (``s3.node.lease.ms``). ``--marker-dir D``: every task attempt that uploaded an object writes ``D/upload-<batch>-<task>-<attempt>``
(its pid inside). ``--metadata-url`` puts the engine's metadata there (shared by several drivers).
``--read-back``: after the query, the driver reads the topic with the ``s3stream`` source as a batch
and prints ``{"event": "read", "rows": [[partition, offset, key], ...]}``.

Each micro-batch the sink finished prints ``{"event": "batch", ...}``, one it refused
``{"event": "error", "type": <exception class>, ...}``; ``{"event": "stopped"}`` at the end.
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


def _kill_after_first_part(marker: str) -> None:
    """In this (executor) process: the next multipart upload SIGKILLs the process once its first part
    is stored, if ``marker`` can still be created (so only one process, once, ever dies this way)."""
    from s3stream.storage.s3upload import S3Upload

    real = S3Upload._upload_part
    if getattr(real, "kills", False):
        return

    async def upload_part(self: Any, number: int, pieces: Any) -> None:
        await real(self, number, pieces)
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return
        os.write(fd, f"{os.getpid()} {self.key}".encode())
        os.close(fd)
        os.kill(os.getpid(), signal.SIGKILL)

    upload_part.kills = True  # type: ignore[attr-defined]
    S3Upload._upload_part = upload_part  # type: ignore[method-assign]


@dataclass(frozen=True)
class TaskFaults:
    """The task observer (pickled to the executors)."""

    driver_pid: int
    kill_during_upload: int
    fail_after_upload: bool
    slow_first_attempt_s: float
    kill_worker_mid_upload: int = -1
    marker_dir: str = ""

    def __call__(self, step: str, batch_id: int, task: int, attempt: int) -> None:
        if step == "after_encode" and task == 0 and batch_id == self.kill_worker_mid_upload:
            _kill_after_first_part(os.path.join(self.marker_dir, "worker-killed"))
        if (
            step == "after_encode"
            and task == 1
            and attempt > 0
            and self.slow_first_attempt_s
            and self.marker_dir
        ):
            # a copy uploads only after the slow attempt did, so both attempts surely write
            first = os.path.join(self.marker_dir, f"upload-{batch_id}-1-0")
            deadline = time.monotonic() + self.slow_first_attempt_s
            while not os.path.exists(first) and time.monotonic() < deadline:
                time.sleep(0.05)
        if step != "after_upload":
            return
        if self.marker_dir:
            name = os.path.join(self.marker_dir, f"upload-{batch_id}-{task}-{attempt}")
            with open(name, "w") as f:
                f.write(str(os.getpid()))
        if task == 0 and batch_id == self.kill_during_upload:
            os.kill(self.driver_pid, signal.SIGKILL)
        if task == 0 and attempt == 0 and self.fail_after_upload:
            raise RuntimeError("injected: task 0 attempt 0 fails after its upload")
        if task == 1 and attempt == 0 and self.slow_first_attempt_s:
            time.sleep(self.slow_first_attempt_s)


def killer_at(kill_at: str | None, stop_at: str | None = None) -> Any:
    """A sink progress observer that SIGKILLs this process when the sink reports step ``kill_at``
    and SIGSTOPs it (once) at ``stop_at``."""

    def observe(step: str) -> None:
        if step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        if step == stop_at:
            print(json.dumps({"event": "stopped_at", "step": step, "pid": os.getpid()}), flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)

    return observe


def _read_back(spark: Any, args: argparse.Namespace) -> None:
    """The topic as the ``s3stream`` source reads it (a batch read), one JSON line."""
    from spark_sink import S3StreamDataSource

    metadata_url = args.metadata_url or "sqlite://" + os.path.abspath(
        os.path.join(args.data_dir, "metadata.db")
    )
    spark.dataSource.register(S3StreamDataSource)
    df = (
        spark.read.format("s3stream")
        .option("topic", "rate")
        .option("bucketUri", args.bucket_uri)
        .option("metadataUrl", metadata_url)
        .load()
    )
    rows = [
        [r["partition"], r["offset"], int(r["key"])]
        for r in df.selectExpr("partition", "offset", "cast(key as string) as key").collect()
    ]
    print(json.dumps({"event": "read", "rows": rows}), flush=True)


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
    parser.add_argument("--kill-worker-mid-upload", type=int, default=-1)
    parser.add_argument("--marker-dir", default="")
    parser.add_argument("--stop-at", default=None)
    parser.add_argument("--metadata-url", default="")
    parser.add_argument("--node-lease-ms", type=int, default=0)
    parser.add_argument("--read-back", action="store_true")
    args = parser.parse_args(argv)
    faulthandler.dump_traceback_later(args.timeout_s * 0.9, exit=False)  # where a hung driver waits

    from pyspark.sql import functions as F

    from s3stream.config import Config
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
        config=Config.from_sources(
            env={},
            metadata_url=args.metadata_url,
            **({"node_lease_ms": args.node_lease_ms} if args.node_lease_ms else {}),
        ),
        progress_observer=killer_at(args.kill_at, args.stop_at),
        task_observer=TaskFaults(
            os.getpid(),
            args.kill_during_upload,
            args.fail_after_upload,
            args.slow_first_attempt,
            args.kill_worker_mid_upload,
            args.marker_dir,
        ),
    )
    done = threading.Event()

    def write(df: Any, batch_id: int) -> None:
        try:
            sink(df, batch_id)
        except Exception as exc:
            error = {"event": "error", "batch_id": batch_id, "type": type(exc).__name__, "message": str(exc)}
            print(json.dumps(error), flush=True)
            raise
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
    if args.read_back:
        _read_back(spark, args)
    print(json.dumps({"event": "stopped"}), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
