"""Executor-side encoding on real Spark: payloads decode (with kafka-python) back to the input rows."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from spark_sink.columns import normalize
from spark_sink.encode import OUTPUT_DDL, EncodeOptions, map_in_arrow

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.record.default_records import DefaultRecordBatch

pytestmark = pytest.mark.spark


def _encode(df: Any, *, partitions: int, stream_column: str | None, target: int = 4096) -> Any:
    rows = normalize(df, batch_id=0, stream_column=stream_column, partition_count=partitions)
    opts = EncodeOptions(
        batch_id=0,
        partition_count=partitions,
        batch_bytes_target=target,
        record_max_bytes=1 << 20,
        partition_column=stream_column or "key hash",
    )
    return rows.mapInArrow(map_in_arrow(opts), OUTPUT_DDL).toArrow()


def test_payloads_hold_every_row_once_grouped_by_partition(spark: Any) -> None:
    from pyspark.sql import functions as F

    df = spark.range(0, 3000, numPartitions=3).select(
        F.col("id").cast("string").alias("key"),
        F.concat(F.lit("v"), F.col("id").cast("string")).alias("value"),
        (F.col("id") % 4).alias("part"),
        F.timestamp_millis(F.lit(1_700_000_000_000) + F.col("id")).alias("timestamp"),
        F.array(
            F.struct(F.lit("h").alias("key"), F.col("id").cast("string").cast("binary").alias("value"))
        ).alias("headers"),
    )
    table = _encode(df, partitions=4, stream_column="part")
    assert table.column("error").null_count == table.num_rows
    seen = {}
    for row in table.to_pylist():
        batch = DefaultRecordBatch(row["payload"])
        assert batch.validate_crc()
        assert batch.records_count == row["record_count"]
        for rec in batch:
            i = int(rec.key)
            assert i % 4 == row["partition"]
            assert rec.value == f"v{i}".encode()
            assert rec.timestamp == 1_700_000_000_000 + i
            assert rec.headers == [("h", str(i).encode())]
            assert i not in seen
            seen[i] = row["partition"]
    assert sorted(seen) == list(range(3000))
    # the byte target cuts batches: several payloads per (task, partition)
    assert table.num_rows > 12


def test_encoding_is_deterministic_across_runs(spark: Any) -> None:
    from pyspark.sql import functions as F

    df = spark.range(0, 2000, numPartitions=2).select(
        F.col("id").cast("string").cast("binary").alias("key"), F.expr("repeat('y', id % 300)").alias("value")
    )
    first = _encode(df, partitions=3, stream_column=None, target=2000).sort_by(
        [("task_partition", "ascending"), ("seq", "ascending")]
    )
    second = _encode(df, partitions=3, stream_column=None, target=2000).sort_by(
        [("task_partition", "ascending"), ("seq", "ascending")]
    )
    # timestamps default to the call's clock: compare what determines the rows, not the payload bytes
    cols = ["partition", "task_partition", "seq", "record_count", "content_crc"]
    assert first.select(cols).to_pylist() == second.select(cols).to_pylist()


def test_cached_columns_serve_every_frame_of_a_schema_and_bad_schemas_still_fail(spark: Any) -> None:
    import time

    from s3stream.errors import InvalidArgumentError
    from spark_sink.columns import ColumnCache
    from spark_sink.encode import PARTITION_COLUMN, TIMESTAMP_MS_COLUMN

    cache: ColumnCache = {}
    a = spark.createDataFrame([("k1", b"v1"), (None, b"v2")], "key string, value binary")
    b = spark.createDataFrame([("k3", b"v3")], "key string, value binary")
    first = normalize(a, batch_id=0, stream_column=None, partition_count=3, cache=cache).collect()
    time.sleep(0.01)
    second = normalize(b, batch_id=1, stream_column=None, partition_count=3, cache=cache).collect()
    assert len(cache) == 1, "one schema, one entry"
    assert [(bytes(r["key"]), bytes(r["value"])) for r in second] == [(b"k3", b"v3")]
    assert [bytes(r["value"]) for r in first] == [b"v1", b"v2"]
    assert all(0 <= r[PARTITION_COLUMN] < 3 for r in first + second)
    # no timestamp column: the clock is read per micro-batch, not frozen in the cache
    assert second[0][TIMESTAMP_MS_COLUMN] > first[0][TIMESTAMP_MS_COLUMN]
    bad = spark.createDataFrame([(1,)], "value int")
    with pytest.raises(InvalidArgumentError, match="micro-batch 2: column 'value' has type int"):
        normalize(bad, batch_id=2, stream_column=None, partition_count=3, cache=cache)
    assert len(cache) == 1
