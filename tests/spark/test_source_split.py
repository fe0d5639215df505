"""A source read whose partitions are cut into several tasks gives exactly the rows of the uncut read.

Real parts: Spark (``local[2]``, separate Python workers), the sink's engine on Ceph RGW, SQLite
metadata. Several sink micro-batches leave each partition in several objects, so
``maxBytesPerTask`` cuts every partition at object boundaries.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from spark_sink import S3StreamDataSource
from spark_sink.source import S3StreamBatchReader, S3StreamPartition
from spark_sink.source_options import parse_options
from tests.spark.source_support import PARTITIONS, TopicEnv, await_query, topic_env, write_batches
from tests.support.s3 import S3TestServer

ROWS = 600
BATCHES = 3


@pytest.fixture
def env(tmp_path: Path, s3_server: S3TestServer, s3_prefix: str) -> TopicEnv:
    return topic_env(tmp_path, s3_server.uri(s3_prefix))


def _rows(df: Any) -> list[tuple[Any, ...]]:
    """Every column of every row, in (partition, offset) order."""
    return [tuple(r) for r in df.orderBy("partition", "offset").collect()]


def _tasks(env: TopicEnv, **options: str) -> list[S3StreamPartition]:
    tasks = S3StreamBatchReader(parse_options({**env.options(), **options}, streaming=False)).partitions()
    assert all(isinstance(t, S3StreamPartition) for t in tasks)
    return [t for t in tasks if isinstance(t, S3StreamPartition)]


def test_split_partitions_yield_exactly_the_rows_of_unsplit_ones(
    spark: Any, env: TopicEnv, tmp_path: Path
) -> None:
    spark.dataSource.register(S3StreamDataSource)
    per = ROWS // BATCHES
    write_batches(env, spark, "w", [(b, b * per, per) for b in range(BATCHES)])

    whole = _tasks(env)
    split = _tasks(env, maxBytesPerTask="1")  # every object its own task
    assert len(whole) == PARTITIONS
    assert len(split) > PARTITIONS, [t.ranges for t in split]
    assert [r for t in split for r in t.ranges] != [r for t in whole for r in t.ranges]
    assert len(_tasks(env, minPartitions=str(2 * PARTITIONS))) > PARTITIONS

    base = spark.read.format("s3stream").options(**env.options())
    expected = _rows(base.load())
    assert len(expected) == ROWS
    assert sorted(int(r[0]) for r in expected) == list(range(ROWS))
    got = _rows(base.option("maxBytesPerTask", "1").load())
    assert got == expected

    # a stream with split tasks and a rate limit: the same rows, each once, over several micro-batches
    seen: list[tuple[Any, ...]] = []
    batches: list[int] = []

    def collect(batch: Any, batch_id: int) -> None:
        rows = [tuple(r) for r in batch.collect()]
        batches.append(len(rows))
        seen.extend(rows)

    stream = (
        spark.readStream.format("s3stream")
        .options(**env.options(), startingOffsets="earliest", maxBytesPerTask="1", maxRecordsPerTrigger="250")
        .load()
    )
    await_query(
        lambda: (
            stream.writeStream.foreachBatch(collect)
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .trigger(availableNow=True)
            .start()
        )
    )
    assert batches == [250, 250, 100]
    assert sorted(seen, key=lambda r: (r[3], r[4])) == expected
