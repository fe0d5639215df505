"""One big micro-batch through the sink's direct path, with the driver's peak memory measured.

``python -m benchmarks.workloads._spark_big_batch --data-dir D --bucket-uri U --mib N --driver-memory 1g``: an
empty micro-batch first (the driver's peak RSS with Spark and the engine started: the baseline), a
1,000-row one (a direct batch warmed up), then one of ``N`` MiB of 1 KiB rows generated on the
executors, all through ``S3StreamSink`` (direct path). Prints one JSON line: rows, seconds, and the
peak RSS (``VmHWM``) of the Python driver after each batch and of the JVM.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

VALUE_BYTES = 1024


def peak_rss_bytes(pid: int) -> int:
    """``VmHWM`` of a process (its peak resident set), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmHWM for pid {pid}")


def jvm_pid() -> int | None:
    """The JVM this driver started (a child process running java)."""
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == me and b"java" in cmd:
            return int(entry.name)
    return None


def _rows(spark: Any, first: int, count: int, tasks: int, partitions: int) -> Any:
    from pyspark.sql import functions as F

    return spark.range(first, first + count, numPartitions=tasks).select(
        F.col("id").cast("string").alias("key"),
        F.concat(F.col("id").cast("string"), F.lit(":"), F.expr(f"repeat('v', {VALUE_BYTES - 12})")).alias(
            "value"
        ),
        (F.col("id") % partitions).cast("int").alias("p"),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--bucket-uri", required=True)
    parser.add_argument("--mib", type=int, required=True)
    parser.add_argument("--driver-memory", default="1g")
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--direct", choices=("true", "false"), default="true")
    parser.add_argument(
        "--persist-level", default="DISK_ONLY", help="local mode: executors share the driver's heap"
    )
    args = parser.parse_args(argv)

    from spark_sink.session import local_session
    from spark_sink.sink import S3StreamSink

    spark = local_session(
        "s3stream-big-batch",
        conf={"spark.driver.memory": args.driver_memory, "spark.driver.maxResultSize": "256m"},
    )
    rows = args.mib * (1 << 20) // VALUE_BYTES
    sink = S3StreamSink(
        args.data_dir,
        bucket_uri=args.bucket_uri,
        topic="big",
        partitions=args.partitions,
        stream_column="p",
        query_id="big",
        direct=args.direct == "true",
        persist_level=args.persist_level,
    )
    try:
        sink(_rows(spark, 0, 0, args.tasks, args.partitions), 0)
        rss_empty = peak_rss_bytes(os.getpid())
        t0 = time.perf_counter()
        sink(_rows(spark, 0, 1000, args.tasks, args.partitions), 1)
        warm_s = time.perf_counter() - t0
        rss_small = peak_rss_bytes(os.getpid())
        t1 = time.perf_counter()
        sink(_rows(spark, 1000, rows, args.tasks, args.partitions), 2)
        big_s = time.perf_counter() - t1
        rss_big = peak_rss_bytes(os.getpid())
        jvm = jvm_pid()
        ends = [s.next_offset for s in sink._ensure_streams()]
    finally:
        sink.close()
    print(
        json.dumps(
            {
                "rows": rows,
                "mib": args.mib,
                "driver_memory": args.driver_memory,
                "small_s": warm_s,
                "big_s": big_s,
                "driver_peak_rss_empty_bytes": rss_empty,
                "driver_peak_rss_small_bytes": rss_small,
                "driver_peak_rss_big_bytes": rss_big,
                "jvm_peak_rss_bytes": None if jvm is None else peak_rss_bytes(jvm),
                "ends": ends,
            }
        ),
        flush=True,
    )
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
