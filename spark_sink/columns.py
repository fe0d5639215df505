"""The sink's input columns: schema checks and normalization (driver side, Spark SQL only).

:func:`normalize` turns a micro-batch with the Kafka sink's columns into the columns the executors
encode (:data:`spark_sink.encode.INPUT_COLUMNS`); a wrong schema is an
:class:`~s3stream.errors.InvalidArgumentError` naming the column and the micro-batch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from s3stream.clock import wall_clock_ms
from s3stream.errors import InvalidArgumentError
from spark_sink.encode import PARTITION_COLUMN, TIMESTAMP_MS_COLUMN

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import StructType


ColumnCache = dict[tuple[str, str | None, int], tuple[list["Column"], bool]]
"""Checked column expressions per (schema JSON, partition column, partition count)."""
COLUMN_CACHE_MAX = 16


def normalize(
    df: DataFrame,
    *,
    batch_id: int,
    stream_column: str | None,
    partition_count: int,
    cache: ColumnCache | None = None,
) -> DataFrame:
    """``df`` with the sink's input columns (see :func:`input_columns`).

    ``cache`` (kept by the sink across micro-batches) maps a schema to its checked column
    expressions: they are unresolved, so they apply to every DataFrame of that schema, and building
    them costs a py4j round trip per function (about a fifth of a small micro-batch's driver time).
    """
    from pyspark.sql import functions as F

    schema = df.schema
    key = (schema.json(), stream_column, partition_count)
    hit = None if cache is None else cache.get(key)
    if hit is None:
        hit = input_columns(
            schema, batch_id=batch_id, stream_column=stream_column, partition_count=partition_count
        )
        if cache is not None:
            if len(cache) >= COLUMN_CACHE_MAX:
                cache.clear()
            cache[key] = hit
    cols, needs_clock = hit
    if needs_clock:
        cols = [*cols, F.lit(wall_clock_ms()).cast("bigint").alias(TIMESTAMP_MS_COLUMN)]
    return df.select(*cols)


def input_columns(
    schema: StructType, *, batch_id: int, stream_column: str | None, partition_count: int
) -> tuple[list[Column], bool]:
    """The sink's input columns for ``schema`` (:data:`spark_sink.encode.INPUT_COLUMNS`), or InvalidArgumentError.

    Returns the column expressions and whether the timestamp must come from the driver's clock (no
    ``timestamp`` column: :func:`normalize` adds it, one value per micro-batch).

    Accepted: ``value`` binary or string (required); ``key`` binary or string; ``headers``
    array<struct<key: string, value: binary>>; ``timestamp`` timestamp or bigint milliseconds; the
    partition column (``stream_column``) of an integer type. Without ``stream_column`` the partition
    is ``pmod(hash(key), partitions)`` (Spark's Murmur3, not Kafka's murmur2), or for a null key
    ``pmod(spark_partition_id(), partitions)``.
    """
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    where = f"micro-batch {batch_id}"
    fields = {f.name: f.dataType for f in schema.fields}

    def binary_or_string(name: str) -> Column:
        dtype = fields[name]
        if isinstance(dtype, T.BinaryType):
            return F.col(name)
        if isinstance(dtype, T.StringType):
            return F.col(name).cast("binary")
        raise InvalidArgumentError(
            f"{where}: column {name!r} has type {dtype.simpleString()}, expected binary or string"
        )

    if "value" not in fields:
        raise InvalidArgumentError(
            f"{where}: the sink needs a column 'value' (binary or string); got {list(fields)}"
        )
    cols: list[Column] = []
    if stream_column is not None:
        if stream_column not in fields:
            raise InvalidArgumentError(
                f"{where}: partition column {stream_column!r} is missing; got {list(fields)}"
            )
        ptype = fields[stream_column]
        if not isinstance(ptype, T.ByteType | T.ShortType | T.IntegerType | T.LongType):
            raise InvalidArgumentError(
                f"{where}: partition column {stream_column!r} has type {ptype.simpleString()}, expected an integer"
            )
        cols.append(F.col(stream_column).cast("int").alias(PARTITION_COLUMN))
    elif "key" in fields:
        key = binary_or_string("key")
        cols.append(
            F.when(key.isNull(), F.pmod(F.spark_partition_id(), F.lit(partition_count)))
            .otherwise(F.pmod(F.hash(key), F.lit(partition_count)))
            .cast("int")
            .alias(PARTITION_COLUMN)
        )
    else:
        cols.append(
            F.pmod(F.spark_partition_id(), F.lit(partition_count)).cast("int").alias(PARTITION_COLUMN)
        )
    cols.append((binary_or_string("key") if "key" in fields else F.lit(None).cast("binary")).alias("key"))
    cols.append(binary_or_string("value").alias("value"))
    if "headers" in fields:
        expected = T.ArrayType(
            T.StructType([T.StructField("key", T.StringType()), T.StructField("value", T.BinaryType())])
        )
        htype = fields["headers"]
        if not (
            isinstance(htype, T.ArrayType)
            and isinstance(htype.elementType, T.StructType)
            and [(f.name, f.dataType) for f in htype.elementType.fields]
            == [(f.name, f.dataType) for f in expected.elementType.fields]  # type: ignore[attr-defined]
        ):
            raise InvalidArgumentError(
                f"{where}: column 'headers' has type {htype.simpleString()}, expected {expected.simpleString()}"
            )
        cols.append(F.col("headers"))
    if "timestamp" in fields:
        ttype = fields["timestamp"]
        if isinstance(ttype, T.TimestampType | T.TimestampNTZType):
            cols.append(F.unix_millis(F.col("timestamp").cast("timestamp")).alias(TIMESTAMP_MS_COLUMN))
        elif isinstance(ttype, T.LongType):
            cols.append(F.col("timestamp").alias(TIMESTAMP_MS_COLUMN))
        else:
            raise InvalidArgumentError(
                f"{where}: column 'timestamp' has type {ttype.simpleString()}, expected timestamp or bigint ms"
            )
        return cols, False
    return cols, True  # no timestamp column: the driver's clock, one value per micro-batch
