"""A local SparkSession with the settings measured to be fast on small machines.

Binds to 127.0.0.1, runs Python workers with this interpreter, no UI, two shuffle partitions, no adaptive
execution, no empty micro-batches (what a small local session needs). Used by the tests, the demo and the
benchmark.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

LOCAL_CONF: dict[str, str] = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.streaming.noDataMicroBatches.enabled": "false",
    "spark.driver.memory": "2g",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.session.timeZone": "UTC",
    # the sink collects its encoded payloads (MiBs per task): send them with the task result
    # instead of through the block manager (capped by spark.rpc.message.maxSize, 128 MiB)
    "spark.task.maxDirectResultSize": str(64 << 20),
}


def prepare_environment() -> None:
    """Environment the JVM and the Python workers need; call before the first session."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable


def local_session(
    app_name: str = "s3stream", *, master: str = "local[2]", conf: Mapping[str, str] | None = None
) -> SparkSession:
    """Get or create the local session (``local[2,3]`` retries failed tasks)."""
    prepare_environment()
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in {**LOCAL_CONF, **(conf or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
