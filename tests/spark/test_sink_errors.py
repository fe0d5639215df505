"""The sink's checks on real Spark: wrong schema, null and oversized values name the column and batch.

These fail before the engine is touched, so they run against a data dir that is never opened.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from s3stream.errors import InvalidArgumentError
from spark_sink.sink import S3StreamSink

pytestmark = pytest.mark.spark


def _sink(tmp_path: Path, **kw: Any) -> S3StreamSink:
    return S3StreamSink(tmp_path / "engine", query_id="q-errors", **kw)


def test_missing_value_column_is_named(spark: Any, tmp_path: Path) -> None:
    df = spark.createDataFrame([(b"k",)], "key binary")
    with pytest.raises(InvalidArgumentError, match=r"micro-batch 3: the sink needs a column 'value'"):
        _sink(tmp_path)(df, 3)


def test_wrong_value_type_is_named(spark: Any, tmp_path: Path) -> None:
    df = spark.createDataFrame([(1,)], "value int")
    with pytest.raises(InvalidArgumentError, match=r"micro-batch 4: column 'value' has type int"):
        _sink(tmp_path)(df, 4)


def test_wrong_headers_type_is_named(spark: Any, tmp_path: Path) -> None:
    df = spark.createDataFrame([(b"v", ["a"])], "value binary, headers array<string>")
    with pytest.raises(InvalidArgumentError, match=r"column 'headers' has type array<string>"):
        _sink(tmp_path)(df, 0)


def test_non_integer_partition_column_is_named(spark: Any, tmp_path: Path) -> None:
    df = spark.createDataFrame([(b"v", "p")], "value binary, part string")
    with pytest.raises(InvalidArgumentError, match=r"partition column 'part' has type string"):
        _sink(tmp_path, partitions=2, stream_column="part")(df, 0)


def test_null_value_is_named_with_the_batch(spark: Any, tmp_path: Path) -> None:
    df = spark.createDataFrame([(b"v",), (None,)], "value binary")
    with pytest.raises(InvalidArgumentError, match=r"micro-batch 7: column 'value' is null in 1 row"):
        _sink(tmp_path)(df, 7)


def test_oversized_value_is_named_with_the_limit(spark: Any, tmp_path: Path) -> None:
    df = spark.createDataFrame([(b"x" * 5000,)], "value binary")
    with pytest.raises(
        InvalidArgumentError, match=r"micro-batch 2: column 'value' holds a value of 5000 bytes"
    ):
        _sink(tmp_path, record_max_bytes=4096)(df, 2)


def test_partition_outside_the_topic_is_named(spark: Any, tmp_path: Path) -> None:
    df = spark.createDataFrame([(b"v", 0), (b"w", 5)], "value binary, part int")
    with pytest.raises(InvalidArgumentError, match=r"column 'part' holds 5, outside the 2 partitions"):
        _sink(tmp_path, partitions=2, stream_column="part")(df, 1)


def test_sink_outside_a_streaming_query_needs_a_query_id(spark: Any, tmp_path: Path) -> None:
    df = spark.createDataFrame([(b"v",)], "value binary")
    with pytest.raises(InvalidArgumentError, match="outside a streaming query"):
        S3StreamSink(tmp_path / "engine")(df, 0)


def test_limits_are_checked_at_construction(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match=r"s3.record.size.max"):
        S3StreamSink(tmp_path, record_max_bytes=64 << 20)
    with pytest.raises(InvalidArgumentError, match="exactly one"):
        S3StreamSink()
