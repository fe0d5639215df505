"""The Spark sink reports each micro-batch to its client's metrics: committed (with rows and commit
latency), skipped (a replay of a committed batch) and error, scraped from the driver client's endpoint
(real Spark, the real engine)."""

from __future__ import annotations

import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from s3stream.config import Config
from s3stream.errors import UnavailableError
from spark_sink.sink import S3StreamSink
from tests.spark.sinks import ROWS

pytestmark = pytest.mark.spark
MiB = 1024 * 1024


def _rows(spark: Any, first: int) -> Any:
    from pyspark.sql import functions as F

    return spark.range(first, first + ROWS, numPartitions=2).select(
        F.col("id").cast("string").alias("key"),
        F.concat(F.col("id").cast("string"), F.lit(":"), F.expr("repeat('v', 100)")).alias("value"),
        (F.col("id") % 2).cast("int").alias("p"),
    )


def _spark_samples(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    body = urllib.request.urlopen(url, timeout=10).read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
        if s.name.startswith("s3stream_spark_")
    }


def test_micro_batches_are_counted_by_outcome_with_rows_and_commit_latency(
    spark: Any, tmp_path: Path
) -> None:
    config = Config(
        wal_capacity_bytes=64 * MiB,
        wal_record_max_bytes=4 * MiB,
        record_max_bytes=1 * MiB,
        metrics_exporter_uri="prometheus://?host=127.0.0.1&port=0",
    )
    sink = S3StreamSink(
        tmp_path / "engine",
        topic="t",
        partitions=2,
        stream_column="p",
        query_id="q",
        config=config,
        direct=False,
        batch_bytes_target=8192,
        record_max_bytes=4096,
    )
    with sink:
        sink(_rows(spark, 0), 0)
        sink(_rows(spark, 0), 0)  # a replay of a committed micro-batch writes nothing
        real = sink.client.append_atomic

        def failing(*args: Any, **kwargs: Any) -> Any:
            raise UnavailableError("injected: the engine refuses the micro-batch")

        sink.client.append_atomic = failing  # type: ignore[method-assign]
        with pytest.raises(UnavailableError, match="injected"):
            sink(_rows(spark, ROWS), 1)
        sink.client.append_atomic = real  # type: ignore[method-assign]
        endpoint = sink.client.metrics_endpoint
        assert endpoint is not None
        samples = _spark_samples(endpoint)
    node = ("node", "0")

    def batches(outcome: str) -> float:
        return samples.get(
            ("s3stream_spark_batches_total", frozenset({node, ("path", "driver"), ("outcome", outcome)})), 0
        )

    assert (batches("committed"), batches("skipped"), batches("error")) == (1, 1, 1)
    assert samples[("s3stream_spark_rows_total", frozenset({node}))] == ROWS
    assert samples[("s3stream_spark_commit_latency_seconds_count", frozenset({node}))] == 1
    assert samples[("s3stream_spark_commit_latency_seconds_sum", frozenset({node}))] > 0
