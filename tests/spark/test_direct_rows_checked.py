"""The direct path checks, on real Spark and Ceph RGW, that both passes saw the same rows and valid rows.

The count pass is a Spark aggregation and the write pass a Python ``mapInArrow``: a micro-batch whose
rows change between them with the same count per (task, partition), as a non-deterministic source
recomputed after its cached block is lost does, fails on the row digests with nothing committed; bad
rows fail in the count pass with the driver path's messages, before any id is prepared.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from s3stream.errors import ConflictError, InvalidArgumentError
from s3stream.metadata.base import ObjectState
from spark_sink.reader import read_records
from spark_sink.sink import S3StreamSink
from tests.support.s3 import S3TestServer

pytestmark = [pytest.mark.spark, pytest.mark.integration]

ROWS = 200


def _random_value() -> bytes:
    return os.urandom(16)


def _nondeterministic_rows(spark: Any) -> Any:
    from pyspark.sql import functions as F

    random_value = F.udf(_random_value, "binary").asNondeterministic()
    return spark.range(0, ROWS, numPartitions=2).select(
        F.col("id").cast("string").alias("key"),
        random_value().alias("value"),
        (F.col("id") % 2).cast("int").alias("p"),
    )


def _sink(data_dir: Path, uri: str, **kwargs: Any) -> S3StreamSink:
    return S3StreamSink(
        data_dir, bucket_uri=uri, topic="t", partitions=2, stream_column="p", query_id="q", **kwargs
    )


def _objects(sink: S3StreamSink, state: ObjectState) -> list[Any]:
    metadata = sink.client.client.engine.metadata
    return asyncio.run_coroutine_threadsafe(metadata.list_objects([state]), sink.client.loop).result()


def test_rows_recomputed_with_other_values_and_the_same_counts_fail_the_batch(
    spark: Any, tmp_path: Path, s3_server: S3TestServer, s3_prefix: str
) -> None:
    def lose_the_cache(step: str) -> None:
        if step.startswith("after_count:"):
            spark.catalog.clearCache()  # the write pass recomputes the rows: new random values

    with _sink(tmp_path / "engine", s3_server.uri(s3_prefix), progress_observer=lose_the_cache) as sink:
        with pytest.raises(ConflictError, match=r"row digest of partition\(s\) \[0, 1\] differs"):
            sink(_nondeterministic_rows(spark), 0)
        assert _objects(sink, ObjectState.COMMITTED) == []
        assert [s.next_offset for s in sink._ensure_streams()] == [0, 0]
        assert read_records(sink, "t") in ({}, {0: [], 1: []})


def test_the_same_rows_kept_between_the_passes_commit(
    spark: Any, tmp_path: Path, s3_server: S3TestServer, s3_prefix: str
) -> None:
    # the control: the persisted rows stay cached, so the random values are the same in both passes
    with _sink(tmp_path / "engine", s3_server.uri(s3_prefix)) as sink:
        sink(_nondeterministic_rows(spark), 0)
        records = read_records(sink, "t")
        assert sorted(len(r) for r in records.values()) == [ROWS // 2, ROWS // 2]


@pytest.mark.parametrize(
    ("column", "message"),
    [
        ("p", r"column 'p' holds 7, outside the 2 partitions \[0, 2\) \(Spark partition \d\)"),
        ("value", r"column 'value' holds a value of 5000 bytes, above the record limit of 4096 bytes"),
    ],
)
def test_bad_rows_fail_in_the_count_pass_with_the_driver_paths_message(
    spark: Any, tmp_path: Path, s3_server: S3TestServer, s3_prefix: str, column: str, message: str
) -> None:
    from pyspark.sql import functions as F

    rows = spark.range(0, 20, numPartitions=2).select(
        F.col("id").cast("string").alias("key"),
        F.when(F.col("id") == 5, F.expr("repeat('v', 5000)") if column == "value" else F.lit("x"))
        .otherwise(F.lit("x"))
        .alias("value"),
        F.when(F.col("id") == 5, F.lit(7 if column == "p" else 1))
        .otherwise(F.col("id") % 2)
        .cast("int")
        .alias("p"),
    )
    with _sink(tmp_path / "engine", s3_server.uri(s3_prefix), record_max_bytes=4096) as sink:
        with pytest.raises(InvalidArgumentError, match=message):
            sink(rows, 0)
        assert _objects(sink, ObjectState.PREPARED) == [], "failed before any id was prepared"
