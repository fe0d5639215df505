"""The sink on real Spark and the real engine (embedded default): rows in equal rows out, read back.

Bounded streaming queries over a parquet directory (``availableNow``), the engine in ``tmp_path``.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest

from s3stream.assembly import open_sync
from s3stream.errors import InvalidArgumentError
from spark_sink.reader import fetch_payloads, read_records, read_topic
from spark_sink.sink import S3StreamSink

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.record.default_records import DefaultRecordBatch

pytestmark = pytest.mark.spark

INPUT_DDL = "key string, value binary, timestamp timestamp, headers array<struct<key: string, value: binary>>"


def _write_input(spark: Any, path: Path, *, files: int, rows_per_file: int) -> None:
    from pyspark.sql import functions as F

    df = spark.range(0, files * rows_per_file, numPartitions=files).select(
        F.when(F.col("id") % 10 == 0, F.lit(None))
        .otherwise(F.concat(F.lit("k"), F.col("id") % 97))
        .alias("key"),
        F.concat(F.col("id").cast("string"), F.lit("-"), F.expr("repeat('v', cast(id % 50 as int))"))
        .cast("binary")
        .alias("value"),
        F.timestamp_millis(F.lit(1_700_000_000_000) + F.col("id") * 7).alias("timestamp"),
        F.when(F.col("id") % 3 == 0, F.array())
        .otherwise(
            F.array(
                F.struct(F.lit("n").alias("key"), F.col("id").cast("string").cast("binary").alias("value"))
            )
        )
        .alias("headers"),
    )
    df.write.parquet(str(path))


def _stream(spark: Any, src: Path, sink: Any, ckpt: Path) -> Any:
    return (
        spark.readStream.schema(INPUT_DDL)
        .option("maxFilesPerTrigger", 1)
        .parquet(str(src))
        .writeStream.foreachBatch(sink)
        .trigger(availableNow=True)
        .option("checkpointLocation", str(ckpt))
        .start()
    )


def test_rows_in_equal_rows_out_with_key_hash_routing(spark: Any, tmp_path: Path) -> None:
    src = tmp_path / "in"
    _write_input(spark, src, files=3, rows_per_file=400)
    with S3StreamSink(tmp_path / "engine", topic="events", partitions=4, batch_bytes_target=4096) as sink:
        query = _stream(spark, src, sink, tmp_path / "ckpt")
        query.awaitTermination(120)
        assert query.exception() is None
        assert [s.batch_id for s in sink.history] == [0, 1, 2]
        assert all(s.rows == 400 for s in sink.history)

        expected_rows = spark.read.parquet(str(src)).collect()
        got_rows = read_topic(spark, sink, "events").collect()
        assert len(got_rows) == 1200
        assert sorted(map(_row_key, got_rows)) == sorted(map(_row_key, expected_rows))

        # offsets of every partition are contiguous from 0; equal keys share a partition
        offsets: dict[int, list[int]] = {}
        partition_of_key: dict[bytes, set[int]] = {}
        for r in got_rows:
            offsets.setdefault(r["partition"], []).append(r["offset"])
            if r["key"] is not None:
                partition_of_key.setdefault(bytes(r["key"]), set()).add(r["partition"])
        assert sorted(offsets) == [0, 1, 2, 3]
        assert all(sorted(o) == list(range(len(o))) for o in offsets.values())
        assert len(partition_of_key) == 97
        assert all(len(p) == 1 for p in partition_of_key.values())

        # kafka-python decodes what the engine stored, with the stream offsets as base offsets
        table, _ = fetch_payloads(sink, "events")
        decoded = 0
        for row in table.to_pylist():
            batch = DefaultRecordBatch(row["payload"])
            assert batch.validate_crc()
            assert batch.base_offset == row["base_offset"]
            decoded += len(list(batch))
        assert decoded == 1200


def _row_key(row: Any) -> tuple[Any, ...]:
    headers = tuple((h["key"], bytes(h["value"])) for h in (row["headers"] or []))
    key = row["key"]
    key = b"" if key is None else key.encode() if isinstance(key, str) else bytes(key)
    return (key, row["key"] is None, bytes(row["value"]), row["timestamp"], headers)


def test_replayed_batch_id_is_skipped(spark: Any, tmp_path: Path) -> None:
    df = spark.createDataFrame([(f"r{i}".encode(),) for i in range(50)], "value binary")
    with S3StreamSink(tmp_path / "engine", topic="t", query_id="q1") as sink:
        sink(df, 0)
        sink(df, 0)  # Spark's replay of batch 0 after a crash before its commit
        sink(df, 1)
        assert [s.chunks_written for s in sink.history] == [1, 0, 1]
        records = read_records(sink, "t")
    assert [r.value for r in records[0]] == [f"r{i}".encode() for i in range(50)] * 2
    assert [r.offset for r in records[0]] == list(range(100))


def test_a_second_query_id_writes_its_own_batches(spark: Any, tmp_path: Path) -> None:
    df = spark.createDataFrame([(b"x",)], "value binary")
    with S3StreamSink(tmp_path / "engine", topic="t", query_id="a") as sink:
        sink(df, 0)
    with S3StreamSink(tmp_path / "engine", topic="t", query_id="b") as sink:
        sink(df, 0)
        assert len(read_records(sink, "t")[0]) == 2


def test_unavailable_engine_fails_the_query_and_the_restart_replays_cleanly(
    spark: Any, tmp_path: Path
) -> None:
    src = tmp_path / "in"
    _write_input(spark, src, files=2, rows_per_file=100)
    engine, ckpt = tmp_path / "engine", tmp_path / "ckpt"
    holder = open_sync(engine)  # another owner holds the data dir: the sink cannot open the engine
    try:
        sink = S3StreamSink(engine, topic="t")
        query = _stream(spark, src, sink, ckpt)
        from pyspark.errors import StreamingQueryException

        with pytest.raises(StreamingQueryException, match="data dir in use"):
            query.awaitTermination(120)
        sink.close()
    finally:
        holder.close()
    assert not (ckpt / "commits" / "0").exists()
    with S3StreamSink(engine, topic="t") as sink:
        query = _stream(spark, src, sink, ckpt)
        query.awaitTermination(120)
        assert query.exception() is None
        assert [s.batch_id for s in sink.history] == [0, 1]
        values = [r.value for r in read_records(sink, "t")[0]]
    assert len(values) == 200
    assert len(set(values)) == 200


def test_topic_partition_count_is_fixed(spark: Any, tmp_path: Path) -> None:
    df = spark.createDataFrame([(b"x",)], "value binary")
    with S3StreamSink(tmp_path / "engine", topic="t", partitions=2, query_id="q") as sink:
        sink(df, 0)
    with (
        S3StreamSink(tmp_path / "engine", topic="t", partitions=3, query_id="q") as sink,
        pytest.raises(InvalidArgumentError, match="exists with 2 partitions"),
    ):
        sink(df, 1)


def test_inline_and_spilled_payloads_store_the_same_records(spark: Any, tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    df = spark.range(0, 3000, numPartitions=2).select(
        F.col("id").cast("string").alias("key"), F.expr("repeat('z', cast(id % 700 as int))").alias("value")
    )
    stored = {}
    for spill in (False, True):
        with S3StreamSink(
            tmp_path / f"engine-{spill}",
            topic="t",
            partitions=3,
            query_id="q",
            spill=spill,
            batch_bytes_target=65536,
        ) as sink:
            sink(df, 0)
            records = read_records(sink, "t")
            stored[spill] = {p: [(r.offset, r.key, r.value) for r in recs] for p, recs in records.items()}
            assert sum(len(v) for v in stored[spill].values()) == 3000
        assert not any((tmp_path / f"engine-{spill}" / "spark-spill").glob("*/*")), "spill files are removed"
    assert stored[False] == stored[True]


def test_stale_spill_directories_are_removed_but_nothing_else(spark: Any, tmp_path: Path) -> None:
    spill_root = tmp_path / "spill"
    stale = spill_root / "b7-0123456789ab"
    stale.mkdir(parents=True)
    (stale / "b7-p0-a0-x.kafka").write_bytes(b"left over")
    keep = spill_root / "not-ours.txt"
    keep.write_text("user data")
    df = spark.createDataFrame([(b"x",)], "value binary")
    with S3StreamSink(tmp_path / "engine", topic="t", query_id="q", spill=True, spill_dir=spill_root) as sink:
        sink(df, 0)
    assert not stale.exists()
    assert keep.read_text() == "user data"
    assert sorted(p.name for p in spill_root.iterdir()) == ["not-ours.txt"]
