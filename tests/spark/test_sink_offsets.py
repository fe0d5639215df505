"""Read-committed visibility and the sink's offset checks, on real Spark and the real engine.

Faults are injected by wrapping the sink client's ``append_atomic`` (the engine underneath is real):
a failure after chunk 0 of a multi-chunk micro-batch (the in-process twin of the SIGKILL in
``test_exactly_once_crash.py``), and a foreign append slipped in before the sink's own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from s3stream.errors import ConflictError, InvalidArgumentError, OffsetOutOfRangeError, UnavailableError
from s3stream.model import RecordBatch
from spark_sink.abandon import abandon_unfinished
from spark_sink.kafka_codec import encode_batch
from spark_sink.protocol import QUERY_ID_MAX_BYTES, committed_key, progress_key
from spark_sink.reader import read_records
from spark_sink.sink import S3StreamSink
from tests.spark.sinks import ROWS, Appends, small_chunk_sink

pytestmark = pytest.mark.spark


def _rows(spark: Any, first: int) -> Any:
    from pyspark.sql import functions as F

    return spark.range(first, first + ROWS, numPartitions=2).select(
        F.col("id").cast("string").alias("key"),
        F.concat(F.col("id").cast("string"), F.lit(":"), F.expr("repeat('v', 300)")).alias("value"),
        (F.col("id") % 2).cast("int").alias("p"),
    )


def _keys(sink: S3StreamSink) -> list[int]:
    return sorted(int(r.key or b"") for recs in read_records(sink, "t").values() for r in recs)


def _raw_count(sink: S3StreamSink) -> int:
    return sum(s.next_offset for s in sink._ensure_streams())


def _wrap_append_atomic(sink: S3StreamSink, before: Callable[[int], None]) -> Any:
    """Run ``before(call number)`` ahead of each ``append_atomic``; returns the real method."""
    real = sink.client.append_atomic
    calls = [0]

    def wrapper(appends: Appends, *, kv: Mapping[str, bytes] | None = None) -> list[int]:
        before(calls[0])
        calls[0] += 1
        return real(appends, kv=kv)

    sink.client.append_atomic = wrapper  # type: ignore[method-assign]
    return real


def test_an_unfinished_micro_batch_is_invisible_until_its_replay_completes_it(
    spark: Any, tmp_path: Path
) -> None:
    with small_chunk_sink(tmp_path / "engine", "q") as sink:
        sink(_rows(spark, 0), 0)
        assert sink.history[-1].chunks >= 3
        assert _keys(sink) == list(range(ROWS))

        def fail_after_chunk_0(call: int) -> None:
            if call == 1:
                raise UnavailableError("injected: the driver dies after chunk 0")

        real = _wrap_append_atomic(sink, fail_after_chunk_0)
        with pytest.raises(UnavailableError, match="injected"):
            sink(_rows(spark, ROWS), 1)
        assert ROWS < _raw_count(sink) < 2 * ROWS, "chunk 0 of batch 1 is in the streams"
        assert _keys(sink) == list(range(ROWS)), "... and invisible through the reader"
        ends = {p: (0, s.next_offset) for p, s in enumerate(sink._ensure_streams())}
        with pytest.raises(OffsetOutOfRangeError, match="outside the committed"):
            read_records(sink, "t", ends)

        # another query must not write after the unfinished batch (that would expose it)
        other = S3StreamSink(client=sink.client, topic="t", partitions=2, stream_column="p", query_id="q2")
        other._streams = sink._ensure_streams()
        other._topic = sink._topic
        raw = _raw_count(sink)
        with pytest.raises(ConflictError, match="left a micro-batch unfinished"):
            other(_rows(spark, 10 * ROWS), 0)
        assert _raw_count(sink) == raw

        sink.client.append_atomic = real  # type: ignore[method-assign]
        sink(_rows(spark, ROWS), 1)  # Spark's replay of batch 1
        stats = sink.history[-1]
        assert 0 < stats.chunks_written < stats.chunks, "the replay resumed after chunk 0"
        assert _keys(sink) == list(range(2 * ROWS)), "all of batch 1, exactly once"
        assert _raw_count(sink) == 2 * ROWS


def test_a_foreign_append_is_refused_before_anything_is_written(spark: Any, tmp_path: Path) -> None:
    with small_chunk_sink(tmp_path / "engine", "q") as sink:
        sink(_rows(spark, 0), 0)
        progress = sink.client.kv.get(progress_key("q", "t"))
        stream = sink._ensure_streams()[1]
        stream.append(RecordBatch(bytes(encode_batch([b"x"], [b"foreign"], [0])), 1))
        with pytest.raises(
            ConflictError, match=r"partition 1 of topic 't' ends at offset \d+, the sink expected"
        ):
            sink(_rows(spark, ROWS), 1)
        assert _raw_count(sink) == ROWS + 1, "nothing of batch 1 was written"
        assert sink.client.kv.get(progress_key("q", "t")) == progress
        assert _keys(sink) == list(range(ROWS)), "the foreign record is past the committed end"


def test_a_foreign_append_racing_a_call_is_refused_before_the_chunk_is_written(
    spark: Any, tmp_path: Path
) -> None:
    with small_chunk_sink(tmp_path / "engine", "q") as sink:
        sink(_rows(spark, 0), 0)
        progress = sink.client.kv.get(progress_key("q", "t"))
        stream = sink._ensure_streams()[0]

        def foreign_append_first(call: int) -> None:
            if call == 0:  # after the sink's offset check, before chunk 0
                stream.append(RecordBatch(bytes(encode_batch([b"x"], [b"foreign"], [0])), 1))

        real = _wrap_append_atomic(sink, foreign_append_first)
        with pytest.raises(ConflictError, match="chunk 0 was refused"):
            sink(_rows(spark, ROWS), 1)
        assert _raw_count(sink) == ROWS + 1, "nothing of batch 1 was written"
        assert sink.client.kv.get(progress_key("q", "t")) == progress, "nor its progress record"
        sink.client.append_atomic = real  # type: ignore[method-assign]
        with pytest.raises(ConflictError, match="ends at offset"):
            sink(_rows(spark, ROWS), 1)  # the streams hold a record outside the protocol
        assert _keys(sink) == list(range(ROWS)), "batch 1 never became visible"
    with (
        small_chunk_sink(tmp_path / "engine", "q") as sink,
        pytest.raises(ConflictError, match="ends at offset"),
    ):
        sink(_rows(spark, ROWS), 1)  # a new sink finds the streams off the protocol before writing


def test_a_foreign_append_racing_the_last_chunk_never_becomes_visible(spark: Any, tmp_path: Path) -> None:
    """The last chunk carries the committed record: committed at moved offsets, its ends would
    expose the foreign record and hide the micro-batch's tail."""
    with small_chunk_sink(tmp_path / "engine", "q") as sink:
        sink(_rows(spark, 0), 0)
        committed = sink.client.kv.get(committed_key("t"))
        stream = sink._ensure_streams()[1]
        real = sink.client.append_atomic
        chunks = [0]

        def foreign_before_last_chunk(
            appends: Appends, *, kv: Mapping[str, bytes] | None = None
        ) -> list[int]:
            chunks[0] += 1
            if kv is not None and committed_key("t") in kv:  # the last chunk
                stream.append(RecordBatch(bytes(encode_batch([b"999999"], [b"foreign"], [0])), 1))
            return real(appends, kv=kv)

        sink.client.append_atomic = foreign_before_last_chunk  # type: ignore[method-assign]
        with pytest.raises(ConflictError) as refused:
            sink(_rows(spark, ROWS), 1)
        assert chunks[0] >= 3, "a multi-chunk micro-batch"
        assert sink.client.kv.get(committed_key("t")) == committed, "the committed ends did not move"
        assert _keys(sink) == list(range(ROWS)), "neither the foreign record nor batch 1 is visible"
        assert f"chunk {chunks[0] - 1} was refused" in str(refused.value)
        assert "nothing foreign became visible" in str(refused.value)
        sink.client.append_atomic = real  # type: ignore[method-assign]
        with pytest.raises(ConflictError, match="ends at offset"):
            sink(_rows(spark, ROWS), 1)  # its replay: the foreign record lies after its chunks
        raw = _raw_count(sink)
    plan = abandon_unfinished(tmp_path / "engine", "t")  # the operator discards batch 1 and the record
    assert (plan.query_id, plan.discard_count) == ("q", raw - ROWS)
    with small_chunk_sink(tmp_path / "engine", "q2") as sink:
        sink(_rows(spark, 10 * ROWS), 0)
        assert _keys(sink) == [*range(ROWS), *range(10 * ROWS, 11 * ROWS)]


def test_one_query_writes_two_topics_through_two_sinks_exactly_once(spark: Any, tmp_path: Path) -> None:
    # Progress records used to be keyed by query id alone: topic u's batch 0 read topic t's "batch 0
    # complete" and wrote nothing (silent loss; with other rows than t's, a ConflictError).
    with small_chunk_sink(tmp_path / "engine", "q") as sink_t:
        sink_u = S3StreamSink(
            client=sink_t.client,
            topic="u",
            partitions=2,
            stream_column="p",
            query_id="q",
            batch_bytes_target=8192,
            record_max_bytes=4096,
            chunk_max_bytes=20_000,
        )
        with sink_u:
            for batch in (0, 1):
                sink_t(_rows(spark, batch * ROWS), batch)
                sink_u(_rows(spark, batch * ROWS), batch)  # the same rows to both topics
            for sink in (sink_t, sink_u):  # Spark's replay of batch 1
                sink(_rows(spark, ROWS), 1)
                assert sink.history[-1].chunks_written == 0
            t_keys = sorted(int(r.key or b"") for recs in read_records(sink_t, "t").values() for r in recs)
            u_keys = sorted(int(r.key or b"") for recs in read_records(sink_u, "u").values() for r in recs)
    assert t_keys == list(range(2 * ROWS))
    assert u_keys == list(range(2 * ROWS))


def test_a_query_id_too_long_for_the_kv_budget_is_refused_before_anything_is_written(
    spark: Any, tmp_path: Path
) -> None:
    with small_chunk_sink(tmp_path / "engine", "q" * (QUERY_ID_MAX_BYTES + 1)) as sink:
        with pytest.raises(InvalidArgumentError, match="query id"):
            sink(_rows(spark, 0), 0)
        assert _raw_count(sink) == 0
