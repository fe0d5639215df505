"""The direct path's count pass: a Spark aggregation over the persisted micro-batch, rows stay in the JVM.

Before the write pass can encode with absolute offsets, the driver needs, per (Spark partition, topic
partition), the number of rows (:func:`~spark_sink.direct_protocol.plan_bases` turns them into base
offsets). :func:`count_pass` gets them with one ``groupBy(spark_partition_id(), partition)``
aggregation: partial aggregation on each task, so no row crosses into a Python worker and only
``tasks x partitions`` small rows reach the driver. The same aggregation carries the row checks the
driver path makes on the executors (:func:`~spark_sink.encode.check_rows`: null values, partitions out
of range, null timestamps, keys or values above the record limit; the same messages) and the row
digest (:mod:`spark_sink.direct_digest`) that the write pass recomputes from the rows it encodes.

``spark_partition_id()`` of the persisted DataFrame is the ``TaskContext.partitionId()`` the write
pass's ``mapInArrow`` sees over the same DataFrame: both are narrow over its partitions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from s3stream.errors import InvalidArgumentError
from spark_sink.direct_digest import DIGEST_COLUMN, HALF_BITS, digest_from_halves
from spark_sink.direct_protocol import TaskCount
from spark_sink.encode import INPUT_COLUMNS, PARTITION_COLUMN, TIMESTAMP_MS_COLUMN, EncodeOptions

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def with_digest(rows: DataFrame) -> DataFrame:
    """The normalized ``rows`` with :data:`DIGEST_COLUMN`: ``xxhash64`` of every input column.

    Added before the micro-batch is persisted, so a recomputed block recomputes its hashes from the
    recomputed rows: the write pass's digest follows the rows it actually encodes.
    """
    from pyspark.sql import functions as F

    present = [c for c in INPUT_COLUMNS if c in rows.columns]
    return rows.select(*present, F.xxhash64(*[F.col(c) for c in present]).alias(DIGEST_COLUMN))


def count_pass(rows: DataFrame, options: EncodeOptions) -> list[TaskCount]:
    """One :class:`TaskCount` per (Spark partition, topic partition) of ``rows`` (which carry
    :data:`DIGEST_COLUMN`), or the first bad row's :class:`InvalidArgumentError`."""
    from pyspark.sql import functions as F

    value_bytes = F.octet_length(F.col("value"))
    key_bytes = F.coalesce(F.octet_length(F.col("key")), F.lit(0))
    digest = F.col(DIGEST_COLUMN)
    grouped = rows.groupBy(
        F.spark_partition_id().alias("task"), F.col(PARTITION_COLUMN).alias("partition")
    ).agg(
        F.count(F.lit(1)).alias("records"),
        F.sum(F.coalesce(value_bytes, F.lit(0)) + key_bytes).alias("payload_bytes"),
        F.count_if(F.col("value").isNull()).alias("null_values"),
        F.count_if(F.col(TIMESTAMP_MS_COLUMN).isNull()).alias("null_timestamps"),
        F.max(value_bytes).alias("value_bytes_max"),
        F.max(key_bytes).alias("key_bytes_max"),
        F.sum(digest.bitwiseAND(F.lit((1 << HALF_BITS) - 1))).alias("digest_low"),
        F.sum(F.shiftrightunsigned(digest, HALF_BITS)).alias("digest_high"),
    )
    collected = sorted(
        (r.asDict() for r in grouped.collect()),
        key=lambda r: (r["task"], -1 if r["partition"] is None else r["partition"]),
    )
    for row in collected:
        message = _row_error(row, options)
        if message is not None:
            raise InvalidArgumentError(f"{message} (Spark partition {row['task']})")
    return [
        TaskCount(
            int(r["task"]),
            int(r["partition"]),
            int(r["records"]),
            int(r["payload_bytes"] or 0),
            digest_from_halves(int(r["digest_low"] or 0), int(r["digest_high"] or 0)),
        )
        for r in collected
    ]


def _row_error(row: dict[str, Any], options: EncodeOptions) -> str | None:
    """The message :func:`~spark_sink.encode.check_rows` gives for the first bad column of a group."""
    where = f"micro-batch {options.batch_id}"
    if row["null_values"]:
        return f"{where}: column 'value' is null in {row['null_values']} row(s); the sink needs a value"
    partition = row["partition"]
    if partition is None:
        return f"{where}: column {options.partition_column!r} is null in {row['records']} row(s)"
    if not 0 <= partition < options.partition_count:
        return (
            f"{where}: column {options.partition_column!r} holds {partition}, outside the "
            f"{options.partition_count} partitions [0, {options.partition_count})"
        )
    if row["null_timestamps"]:
        return f"{where}: column 'timestamp' is null in {row['null_timestamps']} row(s)"
    for name in ("value", "key"):
        longest = row[f"{name}_bytes_max"]
        if longest is not None and longest > options.record_max_bytes:
            return (
                f"{where}: column {name!r} holds a value of {longest} bytes, above the record limit "
                f"of {options.record_max_bytes} bytes"
            )
    return None
