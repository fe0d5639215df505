"""The sink's direct path on real Spark, the real engine and Ceph RGW: executors upload, the driver commits.

Checked through the sink's reader (read-committed) and the metadata: every row once, offsets
contiguous from 0, a replay commits nothing, the ids of unused attempt slots are released, and data
the driver path left in the engine's WAL and LogCache is uploaded before a direct commit (never
dropped as "lost").
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from s3stream.metadata.base import ObjectState
from spark_sink.reader import read_records, read_topic
from spark_sink.sink import S3StreamSink
from tests.support.s3 import S3TestServer

pytestmark = [pytest.mark.spark, pytest.mark.integration]

ROWS = 400


def _rows(spark: Any, first: int, *, tasks: int = 2, partitions: int = 2, count: int = ROWS) -> Any:
    from pyspark.sql import functions as F

    return spark.range(first, first + count, numPartitions=tasks).select(
        F.col("id").cast("string").alias("key"),
        F.concat(F.col("id").cast("string"), F.lit(":"), F.expr("repeat('v', 300)")).alias("value"),
        (F.col("id") % partitions).cast("int").alias("p"),
    )


def _sink(data_dir: Path, uri: str, *, partitions: int = 2, query_id: str = "q") -> S3StreamSink:
    return S3StreamSink(
        data_dir,
        bucket_uri=uri,
        topic="t",
        partitions=partitions,
        stream_column="p",
        query_id=query_id,
        batch_bytes_target=8192,
        record_max_bytes=4096,
    )


def _check_exact(sink: S3StreamSink, rows: int) -> None:
    records = read_records(sink, "t")
    keys = sorted(int(r.key or b"") for recs in records.values() for r in recs)
    assert keys == list(range(rows)), "every row exactly once"
    for p, recs in records.items():
        assert [r.offset for r in recs] == list(range(len(recs))), f"partition {p}: contiguous offsets"


def _objects(sink: S3StreamSink, state: ObjectState) -> list[Any]:
    metadata = sink.client.client.engine.metadata
    return asyncio.run_coroutine_threadsafe(metadata.list_objects([state]), sink.client.loop).result()


def test_direct_is_the_default_on_s3_and_replays_commit_nothing(
    spark: Any, tmp_path: Path, s3_server: S3TestServer, s3_prefix: str
) -> None:
    with _sink(tmp_path / "engine", s3_server.uri(s3_prefix)) as sink:
        sink(_rows(spark, 0), 0)
        sink(_rows(spark, ROWS), 1)
        stats = sink.direct_history[-1]
        assert (stats.rows, stats.tasks, stats.objects, stats.stream_objects) == (ROWS, 2, 2, 0)
        _check_exact(sink, 2 * ROWS)
        committed = _objects(sink, ObjectState.COMMITTED)
        assert len(committed) == 4
        assert _objects(sink, ObjectState.PREPARED) == [], "unused slot ids are released at the commit"
        sink(_rows(spark, ROWS), 1)  # Spark's replay of batch 1 after a crash before commits/1
        assert sink.direct_history[-1].skipped
        assert len(_objects(sink, ObjectState.COMMITTED)) == 4
        _check_exact(sink, 2 * ROWS)
        df = read_topic(spark, sink, "t")
        assert df.count() == 2 * ROWS


def test_a_task_holding_one_partition_writes_a_stream_object(
    spark: Any, tmp_path: Path, s3_server: S3TestServer, s3_prefix: str
) -> None:
    with _sink(tmp_path / "engine", s3_server.uri(s3_prefix), partitions=1) as sink:
        sink(_rows(spark, 0, partitions=1), 0)
        stats = sink.direct_history[-1]
        assert (stats.objects, stats.stream_objects) == (2, 2)
        _check_exact(sink, ROWS)


def test_driver_path_data_in_the_wal_is_uploaded_before_a_direct_commit(
    spark: Any, tmp_path: Path, s3_server: S3TestServer, s3_prefix: str
) -> None:
    uri = s3_server.uri(s3_prefix)
    with _sink(tmp_path / "engine", uri) as sink:
        sink.direct = False
        sink(_rows(spark, 0), 0)  # acknowledged, in the WAL and the LogCache, not uploaded yet
        assert _objects(sink, ObjectState.COMMITTED) == []
        sink.direct = True
        sink(_rows(spark, ROWS), 1)
        assert sink.direct_history[-1].objects == 2
        _check_exact(sink, 2 * ROWS)
        sink.direct = False
        sink(_rows(spark, ROWS), 1)  # a replay on the driver path of a batch the direct path committed
        assert sink.history[-1].rows == 0
        _check_exact(sink, 2 * ROWS)
    with _sink(tmp_path / "engine", uri) as reopened:  # nothing was dropped as "lost"
        _check_exact(reopened, 2 * ROWS)
        reopened(_rows(spark, 2 * ROWS), 2)
        _check_exact(reopened, 3 * ROWS)


def test_an_empty_micro_batch_commits_nothing_and_the_next_one_continues(
    spark: Any, tmp_path: Path, s3_server: S3TestServer, s3_prefix: str
) -> None:
    with _sink(tmp_path / "engine", s3_server.uri(s3_prefix)) as sink:
        sink(_rows(spark, 0, count=0), 0)
        assert sink.direct_history[-1].rows == 0
        assert _objects(sink, ObjectState.PREPARED) == []
        sink(_rows(spark, 0), 1)
        _check_exact(sink, ROWS)
