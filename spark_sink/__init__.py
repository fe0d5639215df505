"""Spark Structured Streaming into s3stream: a foreachBatch sink, a reader, the Kafka payload codec.

``from spark_sink import S3StreamSink, S3StreamDataSource, read_topic, run_demo, abandon_unfinished`` (imported lazily: the codec and the
protocol modules work without pyspark). Documentation: ``docs/spark-sink.md``.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "S3StreamDataSource",
    "S3StreamSink",
    "abandon_unfinished",
    "read_records",
    "read_topic",
    "run_demo",
]

_LAZY = {
    "S3StreamSink": "spark_sink.sink",
    "S3StreamDataSource": "spark_sink.source",
    "read_topic": "spark_sink.reader",
    "read_records": "spark_sink.reader",
    "run_demo": "spark_sink.demo",
    "abandon_unfinished": "spark_sink.abandon",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'spark_sink' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
