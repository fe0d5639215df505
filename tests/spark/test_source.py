"""The ``s3stream`` Spark source on real parts: Spark, the sink's engine on Ceph RGW, SQLite or PostgreSQL.

Readers (the driver's and the executors') open only the metadata and the bucket, beside the
writer; they see the committed micro-batches of the sink, minus ranges the abandon tool discarded.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from s3stream.assembly import open_sync
from s3stream.model import RecordBatch
from spark_sink import S3StreamDataSource
from spark_sink.abandon import abandon_unfinished
from spark_sink.kafka_codec import encode_batch
from spark_sink.source_read import SOURCE_SCHEMA
from spark_sink.topic import describe_topic
from spark_sink.worker_start import is_worker_start_timeout
from tests.spark.source_support import (
    PARTITIONS,
    TopicEnv,
    await_query,
    check_offsets,
    keys_of,
    topic_env,
    write_batches,
)
from tests.support.s3 import S3TestServer


@pytest.fixture
def env(tmp_path: Path, s3_server: S3TestServer, s3_prefix: str) -> TopicEnv:
    return topic_env(tmp_path, s3_server.uri(s3_prefix))


@pytest.fixture
def spark_s3(spark: Any) -> Any:
    spark.dataSource.register(S3StreamDataSource)
    return spark


def _batch(spark: Any, env: TopicEnv, **options: str) -> Any:
    return spark.read.format("s3stream").options(**env.options(), **options).load()


def _stream(spark: Any, env: TopicEnv, **options: str) -> Any:
    return spark.readStream.format("s3stream").options(**env.options(), **options).load()


def _run_available_now(df: Any, checkpoint: Path) -> list[tuple[int, list[int]]]:
    """Run the stream with Trigger.AvailableNow; per micro-batch, its id and sorted keys."""
    seen: list[tuple[int, list[int]]] = []

    def collect(batch: Any, batch_id: int) -> None:
        seen.append((batch_id, keys_of(batch)))

    await_query(
        lambda: (
            df.writeStream.foreachBatch(collect)
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
    )
    return seen


def test_pipeline_sink_to_source_to_parquet_gives_exactly_the_input_rows(
    spark_s3: Any, env: TopicEnv, tmp_path: Path
) -> None:
    spark = spark_s3
    from pyspark.errors import StreamingQueryException
    from pyspark.sql import functions as F

    sink = env.sink("writer")
    written: list[int] = []
    first_batch = threading.Event()

    def ingest(df: Any, batch_id: int) -> None:
        sink(df, batch_id)
        written.append(sink.history[-1].rows)
        first_batch.set()

    source = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", 200)
        .option("numPartitions", 2)
        .option("startTimestamp", 1_700_000_000_000)
        .load()
    )
    pad = "x" * 300
    writer = (
        source.select(
            F.col("value").cast("string").alias("key"),
            F.concat(F.col("value").cast("string"), F.lit(":" + pad)).alias("value"),
            (F.col("value") % PARTITIONS).cast("int").alias("partition"),
            F.col("timestamp"),
        )
        .writeStream.foreachBatch(ingest)
        .option("checkpointLocation", str(tmp_path / "ckpt-in"))
        .trigger(processingTime="300 milliseconds")
        .start()
    )
    out = tmp_path / "out"
    try:
        assert first_batch.wait(300)

        def start_reader(available_now: bool = False) -> Any:
            w = (
                _stream(spark, env, startingOffsets="earliest")
                .writeStream.format("parquet")
                .option("path", str(out))
                .option("checkpointLocation", str(tmp_path / "ckpt-out"))
            )
            return (
                w.trigger(availableNow=True)
                if available_now
                else w.trigger(processingTime="500 milliseconds")
            ).start()

        reader = start_reader()
        deadline = time.monotonic() + 300
        while sum(written) < 2000 and time.monotonic() < deadline:
            time.sleep(0.2)
        writer.stop()
        sink.close()  # uploads the rest of the WAL: every committed row becomes readable
        # catch up: everything committed is uploaded now (restarted from its checkpoint if its
        # Python worker failed to start in time on a loaded machine)
        try:
            reader.processAllAvailable()
            reader.stop()
        except StreamingQueryException as exc:
            if not is_worker_start_timeout(exc):
                raise
        await_query(lambda: start_reader(available_now=True))
    finally:
        writer.stop()
        sink.close()
    total = sum(written)
    assert total >= 2000
    stored = spark.read.parquet(str(out))
    assert keys_of(stored) == list(range(total))
    offsets = check_offsets(stored)
    for p, got in offsets.items():
        assert got == list(range(len(got))), f"partition {p}: offsets not contiguous from 0"


def test_batch_reads_and_starting_offsets(spark_s3: Any, env: TopicEnv, tmp_path: Path) -> None:
    spark = spark_s3
    write_batches(env, spark, "w", [(0, 0, 300), (1, 300, 300)])

    everything = _batch(spark, env)
    assert everything.schema.names == SOURCE_SCHEMA.names
    assert keys_of(everything) == list(range(600))
    row = everything.where("key = cast('7' as binary)").collect()[0]
    assert (row.topic, row.partition, row.timestampType) == ("t", 7 % PARTITIONS, 0)
    assert row.value.decode().startswith("7:")
    assert int(row.timestamp.timestamp()) == 1_700_000_007

    # batch: startingOffsets/endingOffsets as per-partition JSON (-2 earliest, -1 latest)
    part = _batch(
        spark,
        env,
        startingOffsets='{"t": {"0": 10, "1": -2, "2": 50}}',
        endingOffsets='{"t": {"0": 20, "1": 5, "2": -1}}',
    )
    got = check_offsets(part)
    assert got[0] == list(range(10, 20))
    assert got[1] == list(range(5))
    assert got[2] == list(range(50, 200))

    # stream from earliest: everything, then continue exactly from the checkpoint
    ckpt = tmp_path / "ckpt-earliest"
    first = _run_available_now(_stream(spark, env, startingOffsets="earliest"), ckpt)
    assert sorted(k for _, ks in first for k in ks) == list(range(600))

    # stream from latest: nothing of what is there now
    ckpt_latest = tmp_path / "ckpt-latest"
    assert sum(len(ks) for _, ks in _run_available_now(_stream(spark, env), ckpt_latest)) == 0

    write_batches(env, spark, "w", [(2, 600, 150)])
    again = _run_available_now(_stream(spark, env, startingOffsets="earliest"), ckpt)
    assert sorted(k for _, ks in again for k in ks) == list(range(600, 750))
    latest = _run_available_now(_stream(spark, env), ckpt_latest)
    assert sorted(k for _, ks in latest for k in ks) == list(range(600, 750))

    # stream from a per-partition JSON position
    ckpt_json = tmp_path / "ckpt-json"
    fromjson = _run_available_now(
        _stream(spark, env, startingOffsets='{"t": {"0": 200, "1": -1, "2": -2}}'), ckpt_json
    )
    keys = sorted(k for _, ks in fromjson for k in ks)
    assert keys == sorted(
        [750 - 150 + i for i in range(150) if (600 + i) % PARTITIONS == 0] + list(range(2, 750, 3))
    )


def test_rate_limits_split_the_backlog_into_bounded_micro_batches(
    spark_s3: Any, env: TopicEnv, tmp_path: Path
) -> None:
    spark = spark_s3
    write_batches(env, spark, "w", [(0, 0, 900)])

    by_records = _run_available_now(
        _stream(spark, env, startingOffsets="earliest", maxRecordsPerTrigger="250"), tmp_path / "c1"
    )
    sizes = [len(ks) for _, ks in by_records]
    assert sizes == [250, 250, 250, 150]
    assert sorted(k for _, ks in by_records for k in ks) == list(range(900))

    by_bytes = _run_available_now(
        _stream(spark, env, startingOffsets="earliest", maxBytesPerTrigger="200000"), tmp_path / "c2"
    )
    sizes = [len(ks) for _, ks in by_bytes]
    assert len(sizes) >= 5, sizes  # 900 rows of ~1 KiB: at least 4.5 x 200 kB
    assert max(sizes) * 1000 <= 200_000, sizes
    assert sorted(k for _, ks in by_bytes for k in ks) == list(range(900))


def test_unfinished_records_are_invisible_and_discarded_ranges_are_skipped(
    spark_s3: Any, env: TopicEnv, tmp_path: Path
) -> None:
    spark = spark_s3
    write_batches(env, spark, "w1", [(0, 0, 300)])
    # records appended outside the sink, past the committed end of partition 1, then uploaded
    client = open_sync(env.data_dir, bucket_uri=env.bucket_uri, config=env.config())
    try:
        topic = describe_topic(client, "t")
        assert topic is not None
        stream = client.streams.open_stream(topic.stream_ids[1], epoch=0)
        stream.append(RecordBatch(bytes(encode_batch([b"foreign"] * 5, [b"f"] * 5, [0] * 5)), 5))
        stream.close()
    finally:
        client.close()

    assert keys_of(_batch(spark, env)) == list(range(300))  # read-committed: not the foreign records
    ckpt = tmp_path / "ckpt"
    seen = _run_available_now(_stream(spark, env, startingOffsets="earliest"), ckpt)
    assert sorted(k for _, ks in seen for k in ks) == list(range(300))

    plan = abandon_unfinished(env.data_dir, "t", bucket_uri=env.bucket_uri, config=env.config())
    assert plan is not None
    write_batches(env, spark, "w2", [(0, 300, 300)])

    everything = _batch(spark, env)
    assert keys_of(everything) == list(range(600))
    offsets = check_offsets(everything)
    assert offsets[1] == list(range(100)) + list(range(105, 205))  # the 5 discarded offsets are skipped
    more = _run_available_now(_stream(spark, env, startingOffsets="earliest"), ckpt)
    assert sorted(k for _, ks in more for k in ks) == list(range(300, 600))


def test_postgresql_metadata(
    spark_s3: Any, tmp_path: Path, s3_server: S3TestServer, s3_prefix: str, pg_url: str
) -> None:
    spark = spark_s3
    env = topic_env(tmp_path, s3_server.uri(s3_prefix), pg_url)
    write_batches(env, spark, "w", [(0, 0, 200), (1, 200, 100)])
    assert keys_of(_batch(spark, env)) == list(range(300))
    seen = _run_available_now(_stream(spark, env, startingOffsets="earliest"), tmp_path / "ckpt")
    assert sorted(k for _, ks in seen for k in ks) == list(range(300))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"topic": ""}, "option 'topic' is required"),
        ({"startingOffsets": '{"t": {"0": 9999, "1": 0, "2": 0}}'}, "OffsetOutOfRangeError"),
        ({"endingOffsets": "latest"}, "'endingOffsets' is for batch reads"),
        ({"topic": "nope"}, "topic 'nope' does not exist"),
    ],
)
def test_bad_options_are_clear_typed_errors(
    spark_s3: Any, env: TopicEnv, tmp_path: Path, options: dict[str, str], message: str
) -> None:
    """Through Spark, one case per place an error is raised (option parsing, resolving offsets,
    the topic lookup); every option check is in ``tests/unit/test_source_plan.py``."""
    from py4j.protocol import Py4JJavaError  # type: ignore[import-untyped]
    from pyspark.errors import PySparkException

    spark = spark_s3
    if not env.data_dir.exists():
        write_batches(env, spark, "w", [(0, 0, 30)])
    df = spark.readStream.format("s3stream").options(**{**env.options(), **options})

    def run() -> None:
        await_query(
            lambda: (
                df.load()
                .writeStream.format("noop")
                .option("checkpointLocation", str(tmp_path / f"c-{uuid.uuid4().hex[:6]}"))
                .trigger(availableNow=True)
                .start()
            )
        )

    with pytest.raises((PySparkException, Py4JJavaError)) as info:
        run()
    assert message in str(info.value)
