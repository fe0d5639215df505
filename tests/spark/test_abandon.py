"""``spark_sink abandon`` on the real engine (a local data dir): discard an unreplayable micro-batch.

The sink's driver side runs without Spark here: the payloads come from the executors' encoder
(:func:`~spark_sink.encode.encode_partition`) called in-process and go through the sink's own
``_append_payloads``. Faults are injected around the client's ``append_atomic`` as in
``test_sink_offsets.py``. One test reads through Spark (``read_topic``), the only reader path that
needs it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Mapping
from io import StringIO
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from s3stream.assembly import open_sync
from s3stream.errors import (
    ConflictError,
    InvalidArgumentError,
    NotFoundError,
    OffsetOutOfRangeError,
    UnavailableError,
)
from s3stream.facade import SyncClient
from s3stream.model import RecordBatch
from spark_sink import cli
from spark_sink.abandon import NothingToDiscardError, abandon_unfinished
from spark_sink.encode import (
    OUTPUT_SCHEMA,
    PARTITION_COLUMN,
    TIMESTAMP_MS_COLUMN,
    EncodeOptions,
    encode_partition,
)
from spark_sink.kafka_codec import encode_batch
from spark_sink.payloads import PayloadTable
from spark_sink.protocol import (
    Committed,
    DiscardedRange,
    Progress,
    committed_key,
    progress_key,
    writer_key,
)
from spark_sink.reader import fetch_payloads, read_records, read_topic
from spark_sink.sink import S3StreamSink
from tests.spark.sinks import ROWS, Appends, small_chunk_sink

ROOT = Path(__file__).resolve().parents[2]


def _write(sink: S3StreamSink, batch_id: int, first: int, *, fill: bytes = b"v") -> None:
    """Micro-batch ``batch_id`` of rows ``first .. first + ROWS - 1`` (key = row), as Spark would give it."""
    ids = range(first, first + ROWS)
    rows = pa.RecordBatch.from_pydict(
        {
            PARTITION_COLUMN: pa.array([i % 2 for i in ids], pa.int32()),
            "key": pa.array([str(i).encode() for i in ids], pa.binary()),
            "value": pa.array([f"{i}:".encode() + fill * 300 for i in ids], pa.binary()),
            TIMESTAMP_MS_COLUMN: pa.array([1_700_000_000_000 + i for i in ids], pa.int64()),
        }
    )
    options = EncodeOptions(
        batch_id=batch_id,
        partition_count=sink.partition_count,
        batch_bytes_target=sink.batch_bytes_target,
        record_max_bytes=sink.record_max_bytes,
        partition_column="p",
    )
    half = ROWS // 2  # two Spark partitions (tasks), as spark.range(..., numPartitions=2) gives
    tasks = [encode_partition(options, task, iter([rows.slice(task * half, half)])) for task in (0, 1)]
    table = pa.Table.from_batches([b for task in tasks for b in task], schema=OUTPUT_SCHEMA)
    payloads = PayloadTable(table)
    try:
        assert sink._query_id is not None
        with sink._lock:
            sink.history.append(
                sink._append_payloads(batch_id, sink._query_id, payloads, time.perf_counter(), 0.0)
            )
    finally:
        payloads.close()


def _fail_after(sink: S3StreamSink, chunks: int) -> Any:
    """Make ``append_atomic`` fail once ``chunks`` calls went through; returns the real method."""
    real = sink.client.append_atomic
    calls = [0]

    def wrapper(appends: Appends, *, kv: Mapping[str, bytes] | None = None) -> list[int]:
        if calls[0] == chunks:
            raise UnavailableError(f"injected: the driver dies after chunk {chunks - 1}")
        calls[0] += 1
        return real(appends, kv=kv)

    sink.client.append_atomic = wrapper  # type: ignore[method-assign]
    return real


def _keys(source: S3StreamSink | SyncClient) -> list[int]:
    return sorted(int(r.key or b"") for recs in read_records(source, "t").values() for r in recs)


def _stream_ends(sink: S3StreamSink) -> list[int]:
    return [s.next_offset for s in sink._ensure_streams()]


def _kv_state(client: SyncClient, *query_ids: str) -> list[bytes | None]:
    keys = [committed_key("t"), writer_key("t"), *(progress_key(q, "t") for q in query_ids)]
    return [client.kv.get(k) for k in keys]


def _leave_batch_unfinished(data_dir: Path, *, chunks_done: int = 3) -> list[int]:
    """Batch 0 complete, batch 1 of query q cut after ``chunks_done`` chunks, its replay refused.

    Returns the streams' ends (the committed ends are those after batch 0).
    """
    with small_chunk_sink(data_dir, "q") as sink:
        _write(sink, 0, 0)
        assert sink.history[-1].chunks > chunks_done
        real = _fail_after(sink, chunks_done)
        with pytest.raises(UnavailableError, match="injected"):
            _write(sink, 1, ROWS)
        assert all(e > ROWS // 2 for e in _stream_ends(sink)), "chunks of batch 1 in both partitions"
        sink.client.append_atomic = real  # type: ignore[method-assign]
        # the source replays batch 1 with other rows: refused, never a duplicate
        with pytest.raises(ConflictError, match="replayed with different data"):
            _write(sink, 1, ROWS, fill=b"w")
        # another query cannot write the topic either
        other = S3StreamSink(client=sink.client, topic="t", partitions=2, stream_column="p", query_id="q2")
        other._streams, other._topic = sink._ensure_streams(), sink._topic
        with pytest.raises(ConflictError, match="left a micro-batch unfinished"):
            _write(other, 0, 10 * ROWS)
        assert _keys(sink) == list(range(ROWS))
        return _stream_ends(sink)


def test_an_unreplayable_micro_batch_is_discarded_and_the_topic_takes_writes_again(tmp_path: Path) -> None:
    data_dir = tmp_path / "engine"
    ends = _leave_batch_unfinished(data_dir)
    half = ROWS // 2  # batch 0 put 200 records into each partition

    plan = abandon_unfinished(data_dir, "t")
    assert plan.query_id == "q"
    assert plan.progress is not None
    assert (plan.progress.batch_id, plan.progress.chunks_done) == (1, 3)
    assert [(p.committed_end, p.stream_end) for p in plan.partitions] == [(half, ends[0]), (half, ends[1])]
    assert plan.new_committed.discarded == (
        DiscardedRange(0, half, ends[0]),
        DiscardedRange(1, half, ends[1]),
    )

    with small_chunk_sink(data_dir, "q") as sink:
        assert _keys(sink) == list(range(ROWS)), "the old committed data only"
        table, wanted = fetch_payloads(sink, "t")
        assert all(o < half for o in table.column("base_offset").to_pylist())
        assert [(r.start_offset, r.end_offset) for r in wanted] == [(0, half), (0, half)]
        # the query's replay of the abandoned batch (same rows, as Spark replays) is refused, writes nothing
        with pytest.raises(ConflictError, match="micro-batch 1 was abandoned by an operator"):
            _write(sink, 1, ROWS)
        assert _stream_ends(sink) == ends

    with small_chunk_sink(data_dir, "q2") as sink:
        _write(sink, 0, 1000)
        records = read_records(sink, "t")
        keys = sorted(int(r.key or b"") for recs in records.values() for r in recs)
        assert keys == [*range(ROWS), *range(1000, 1000 + ROWS)], "exactly once, nothing discarded"
        for p in (0, 1):
            offsets = [r.offset for r in records[p]]
            assert offsets == [*range(half), *range(ends[p], ends[p] + half)], "the discarded offsets skipped"
        # an explicit range across the discarded one returns the records on both sides only
        across = read_records(sink, "t", {0: (half - 1, ends[0] + 1)})[0]
        assert [r.offset for r in across] == [half - 1, ends[0]]
        with pytest.raises(OffsetOutOfRangeError, match="outside the committed"):
            read_records(sink, "t", {0: (0, ends[0] + half + 1)})
        # the abandoned query may go on with later micro-batches (its checkpoint moved past batch 1)
        later = S3StreamSink(client=sink.client, topic="t", partitions=2, stream_column="p", query_id="q")
        later._streams, later._topic = sink._ensure_streams(), sink._topic
        _write(later, 2, 2000)
        assert len(_keys(sink)) == 3 * ROWS


def test_the_unfinished_batch_of_a_new_query_is_found_through_the_writer_record(tmp_path: Path) -> None:
    data_dir = tmp_path / "engine"
    with small_chunk_sink(data_dir, "q") as sink:
        _write(sink, 0, 0)  # the committed record names query q
    with small_chunk_sink(data_dir, "q-new-checkpoint") as sink:
        real = _fail_after(sink, 2)
        with pytest.raises(UnavailableError, match="injected"):
            _write(sink, 0, ROWS)
        sink.client.append_atomic = real  # type: ignore[method-assign]
    plan = abandon_unfinished(data_dir, "t")
    assert plan.query_id == "q-new-checkpoint"
    assert plan.committed.query_id == "q"
    with small_chunk_sink(data_dir, "q-new-checkpoint") as sink:
        with pytest.raises(ConflictError, match="micro-batch 0 was abandoned"):
            _write(sink, 0, ROWS)
        assert _keys(sink) == list(range(ROWS))


def test_chunks_budget_the_discarded_ranges_and_a_too_small_chunk_is_refused(tmp_path: Path) -> None:
    with small_chunk_sink(tmp_path / "engine", "q") as sink:
        _write(sink, 0, 0)
        # 20,000-byte chunks keep ~4 kB beside one payload (13.3 kB) and the KV records (1.6 kB)
        payload_max = sink.batch_bytes_target + sink.record_max_bytes + 1024
        room = sink.chunk_max_bytes - payload_max - sink._chunk_kv_max_bytes(Committed.empty(2)) - 1024
        ranges = tuple(DiscardedRange(1, 2 * i, 2 * i + 1) for i in range(room // 50 + 1))
        sink.client.kv.put(committed_key("t"), Committed((200, 10_000), "q", 0, ranges).encode())
        with pytest.raises(InvalidArgumentError, match=r"too small for one payload next to the committed"):
            _write(sink, 1, ROWS)


def test_a_dry_run_shows_the_plan_and_changes_nothing(tmp_path: Path) -> None:
    data_dir = tmp_path / "engine"
    ends = _leave_batch_unfinished(data_dir)
    with open_sync(data_dir) as client:
        before = _kv_state(client, "q")
        plan = abandon_unfinished(client, "t", dry_run=True)
        assert plan.discard_count == sum(ends) - ROWS
        assert _kv_state(client, "q") == before
    with (
        small_chunk_sink(data_dir, "q2") as sink,
        pytest.raises(ConflictError, match="left a micro-batch unfinished"),
    ):
        _write(sink, 0, 1000)


def test_running_it_twice_refuses_the_second_time_and_changes_nothing(tmp_path: Path) -> None:
    data_dir = tmp_path / "engine"
    _leave_batch_unfinished(data_dir)
    abandon_unfinished(data_dir, "t")
    with open_sync(data_dir) as client:
        after = _kv_state(client, "q")
        with pytest.raises(NothingToDiscardError, match="nothing to discard"):
            abandon_unfinished(client, "t")
        with pytest.raises(NothingToDiscardError):
            abandon_unfinished(client, "t", dry_run=True)
        with pytest.raises(InvalidArgumentError, match="already abandoned"):
            abandon_unfinished(client, "t", query_id="q")
        assert _kv_state(client, "q") == after


def test_a_fresh_topic_has_nothing_to_discard(tmp_path: Path) -> None:
    data_dir = tmp_path / "engine"
    with small_chunk_sink(data_dir, "q") as sink:
        _write(sink, 0, 0)
    with pytest.raises(NothingToDiscardError):
        abandon_unfinished(data_dir, "t")


def test_a_missing_data_dir_or_topic_is_not_found_and_not_created(tmp_path: Path) -> None:
    with pytest.raises(NotFoundError, match="does not exist"):
        abandon_unfinished(tmp_path / "nowhere", "t")
    assert not (tmp_path / "nowhere").exists()
    with small_chunk_sink(tmp_path / "engine", "q") as sink:
        _write(sink, 0, 0)
    with pytest.raises(NotFoundError, match="topic 'other' does not exist"):
        abandon_unfinished(tmp_path / "engine", "other")


def test_the_tool_writes_both_records_in_one_append_atomic(tmp_path: Path) -> None:
    data_dir = tmp_path / "engine"
    _leave_batch_unfinished(data_dir)
    with open_sync(data_dir) as client:
        real = client.append_atomic
        calls: list[tuple[int, list[str]]] = []

        def spy(appends: Appends, *, kv: Mapping[str, bytes] | None = None) -> list[int]:
            calls.append((len(appends), sorted(kv or {})))
            raise UnavailableError("injected: the tool dies at its commit")

        client.append_atomic = spy  # type: ignore[method-assign]
        before = _kv_state(client, "q")
        with pytest.raises(UnavailableError, match="injected"):
            abandon_unfinished(client, "t")
        assert calls == [(0, sorted([committed_key("t"), progress_key("q", "t")]))]
        assert _kv_state(client, "q") == before, "all or nothing"
        client.append_atomic = real  # type: ignore[method-assign]
        abandon_unfinished(client, "t")


def test_a_live_sink_is_refused(tmp_path: Path) -> None:
    data_dir = tmp_path / "engine"
    _leave_batch_unfinished(data_dir)
    with small_chunk_sink(data_dir, "q") as sink:
        sink._ensure_streams()
        with pytest.raises(ConflictError, match="data dir in use"):
            abandon_unfinished(data_dir, "t")
        with pytest.raises(ConflictError, match="a live sink"):
            abandon_unfinished(sink.client, "t")


def test_offsets_moved_during_a_call_are_discarded_with_the_batch(tmp_path: Path) -> None:
    data_dir = tmp_path / "engine"
    with small_chunk_sink(data_dir, "q") as sink:
        _write(sink, 0, 0)
        stream = sink._ensure_streams()[0]
        real = sink.client.append_atomic
        calls = [0]

        def foreign_append_second(appends: Appends, *, kv: Mapping[str, bytes] | None = None) -> list[int]:
            calls[0] += 1
            if calls[0] == 2:  # after chunk 0 of batch 1, before chunk 1
                stream.append(RecordBatch(bytes(encode_batch([b"x"], [b"foreign"], [0])), 1))
                sink.client.append_atomic = real  # type: ignore[method-assign]
            return real(appends, kv=kv)

        sink.client.append_atomic = foreign_append_second  # type: ignore[method-assign]
        with pytest.raises(ConflictError, match="chunk 1 was refused"):
            _write(sink, 1, ROWS)
        ends = _stream_ends(sink)
    plan = abandon_unfinished(data_dir, "t")
    assert plan.query_id == "q"
    assert plan.partitions[0].discard_count > 1, "the foreign record and chunk 0 of batch 1"
    with small_chunk_sink(data_dir, "q2") as sink:
        _write(sink, 0, 1000)
        assert _keys(sink) == [*range(ROWS), *range(1000, 1000 + ROWS)]
        assert all(
            b"foreign" not in (r.value or b"") for recs in read_records(sink, "t").values() for r in recs
        )
        assert _stream_ends(sink) == [e + ROWS // 2 for e in ends]


def test_foreign_records_alone_are_discarded_without_touching_any_query(tmp_path: Path) -> None:
    data_dir = tmp_path / "engine"
    with small_chunk_sink(data_dir, "q") as sink:
        _write(sink, 0, 0)
        sink._ensure_streams()[1].append(RecordBatch(bytes(encode_batch([b"x"], [b"foreign"], [0])), 1))
        progress = sink.client.kv.get(progress_key("q", "t"))
    plan = abandon_unfinished(data_dir, "t")
    assert (plan.query_id, plan.discard_count) == (None, 1)
    assert plan.new_committed.discarded == (DiscardedRange(1, ROWS // 2, ROWS // 2 + 1),)
    with small_chunk_sink(data_dir, "q") as sink:
        assert sink.client.kv.get(progress_key("q", "t")) == progress
        _write(sink, 1, ROWS)
        assert _keys(sink) == list(range(2 * ROWS))
        # a second discard right behind the first one on the same partition merges with it
        sink._ensure_streams()[1].append(RecordBatch(bytes(encode_batch([b"x"], [b"foreign"], [0])), 1))
        end = _stream_ends(sink)[1]
    plan = abandon_unfinished(data_dir, "t")
    assert plan.new_committed.discarded == (
        DiscardedRange(1, ROWS // 2, ROWS // 2 + 1),
        DiscardedRange(1, end - 1, end),
    )


def test_version_1_records_are_read_and_an_unfinished_version_1_batch_is_found(tmp_path: Path) -> None:
    """A topic left by the sink before version 2: v1 progress and committed records, no writer record."""
    data_dir = tmp_path / "engine"
    _leave_batch_unfinished(data_dir)
    with open_sync(data_dir) as client:
        raw = client.kv.get(progress_key("q", "t"))
        assert raw is not None
        progress = Progress.decode(raw, key="k")
        v1 = json.loads(raw)
        del v1["abandoned"]
        client.kv.put(progress_key("q", "t"), json.dumps({**v1, "version": 1}).encode())
        half = ROWS // 2
        client.kv.put(
            committed_key("t"),
            json.dumps({"version": 1, "ends": [half, half], "query_id": "q", "batch_id": 0}).encode(),
        )
        client.kv.delete(writer_key("t"))
        assert Progress.decode(client.kv.get(progress_key("q", "t")) or b"", key="k") == progress
        plan = abandon_unfinished(client, "t", dry_run=True)
        assert (plan.query_id, plan.progress) == ("q", progress), "found through the committed record"
        assert _keys(client) == list(range(ROWS))
    plan = abandon_unfinished(data_dir, "t")
    assert plan.new_progress is not None
    assert plan.new_progress.abandoned
    with open_sync(data_dir) as client:
        stored = client.kv.get(committed_key("t"))
        assert stored is not None
        assert Committed.decode(stored, key="k", partition_count=2) == plan.new_committed
        assert json.loads(stored)["version"] == 2


def test_the_cli_shows_then_discards(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data_dir = tmp_path / "engine"
    ends = _leave_batch_unfinished(data_dir)
    base = ["abandon", "--data-dir", str(data_dir), "--topic", "t"]
    out = StringIO()
    assert cli.main([*base, "--dry-run"], out=out) == 0
    text = out.getvalue()
    assert f"[200, {ends[0]})" in text
    assert "query q batch 1, 3 of" in text
    assert "dry run: nothing changed" in text
    # the module entry point (python -m spark_sink abandon), JSON output
    job = subprocess.run(
        [sys.executable, "-m", "spark_sink", *base, "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert job.returncode == 0, job.stderr
    shown = json.loads(job.stdout)
    assert (shown["query_id"], shown["batch_id"], shown["dry_run"]) == ("q", 1, False)
    assert [p["discard_range"] for p in shown["partitions"]] == [[200, ends[0]], [200, ends[1]]]
    assert cli.main(base, out=StringIO()) == 1
    assert "nothing to discard" in capsys.readouterr().err
    with small_chunk_sink(data_dir, "q") as sink:
        sink._ensure_streams()
        assert cli.main(base, out=StringIO()) == 2
        assert "data dir in use" in capsys.readouterr().err


@pytest.mark.spark
def test_read_topic_skips_the_discarded_ranges(spark: Any, tmp_path: Path) -> None:
    data_dir = tmp_path / "engine"
    ends = _leave_batch_unfinished(data_dir)
    abandon_unfinished(data_dir, "t")
    with small_chunk_sink(data_dir, "q2") as sink:
        _write(sink, 0, 1000)
        rows = read_topic(spark, sink, "t").select("partition", "offset", "key").collect()
        assert sorted(int(r["key"]) for r in rows) == [*range(ROWS), *range(1000, 1000 + ROWS)]
        half = ROWS // 2
        for p in (0, 1):
            offsets = sorted(r["offset"] for r in rows if r["partition"] == p)
            assert offsets == [*range(half), *range(ends[p], ends[p] + half)]
