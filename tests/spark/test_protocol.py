"""The exactly-once planner, pure (no Spark, no engine): chunking and replay decisions."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from s3stream.engine.walbody import KV_HEADER
from s3stream.errors import ConflictError, CorruptionError
from spark_sink.abandon import NothingToDiscardError, PartitionState, plan_abandon
from spark_sink.protocol import (
    APPEND_OVERHEAD_BYTES,
    DISCARDED_RANGES_MAX,
    KV_OVERHEAD_BYTES,
    QUERY_ID_MAX_BYTES,
    Committed,
    DiscardedRange,
    PayloadRef,
    Progress,
    Writer,
    chunk_payloads,
    committed_after,
    committed_max_bytes,
    expected_next_offsets,
    legacy_progress_key,
    load_progress,
    plan_batch,
    progress_after,
    progress_key,
    writer_key,
)


def _refs(sizes: list[int], *, crc: int = 0) -> list[PayloadRef]:
    return [PayloadRef(i, i % 3, 10 + i, crc + i, s) for i, s in enumerate(sizes)]


def test_chunks_respect_the_byte_limit_and_keep_order() -> None:
    limit = 10_000
    refs = _refs([3000] * 10)
    chunks = chunk_payloads(refs, limit)
    assert [p.index for c in chunks for p in c.payloads] == list(range(10))
    for c in chunks:
        size = KV_OVERHEAD_BYTES + sum(p.size_bytes + APPEND_OVERHEAD_BYTES for p in c.payloads)
        assert size <= limit
    assert len(chunks) == 5


def test_no_payloads_no_chunks() -> None:
    assert chunk_payloads([], 10_000) == []
    plan = plan_batch(None, 0, [])
    assert plan.skip


def test_fresh_batch_writes_every_chunk() -> None:
    chunks = chunk_payloads(_refs([4000] * 6), 10_000)
    plan = plan_batch(None, 5, chunks)
    assert (plan.first_chunk, plan.chunk_count) == (0, len(chunks))
    older = Progress(4, 1, 1, 0)
    assert plan_batch(older, 5, chunks).first_chunk == 0


def test_committed_batch_is_skipped_on_replay() -> None:
    chunks = chunk_payloads(_refs([4000] * 6), 10_000)
    plan = plan_batch(None, 5, chunks)
    done = progress_after(plan, chunks, len(chunks) - 1)
    assert done.complete
    assert plan_batch(done, 5, chunks).skip
    assert plan_batch(done, 4, chunks).skip  # an older batch than the committed one


def test_partly_committed_batch_resumes_after_the_last_committed_chunk() -> None:
    chunks = chunk_payloads(_refs([4000] * 6), 10_000)
    plan = plan_batch(None, 5, chunks)
    partial = progress_after(plan, chunks, 1)
    replay = plan_batch(Progress.decode(partial.encode(), key="k"), 5, chunks)
    assert (replay.first_chunk, replay.chunk_count) == (2, len(chunks))


def test_replay_with_other_rows_is_a_conflict_not_a_duplicate() -> None:
    chunks = chunk_payloads(_refs([4000] * 6), 10_000)
    partial = progress_after(plan_batch(None, 5, chunks), chunks, 0)
    other = chunk_payloads(_refs([4000] * 6, crc=99), 10_000)
    with pytest.raises(ConflictError, match="replayed with different data"):
        plan_batch(partial, 5, other)
    fewer = chunk_payloads(_refs([4000] * 2), 10_000)
    with pytest.raises(ConflictError, match="the replay has 1 chunks"):
        plan_batch(partial, 5, fewer)


def test_bad_progress_record_is_corruption() -> None:
    for raw in (
        b"",
        b"{}",
        b'{"version": 9}',
        b'{"version":1,"batch_id":1,"chunk_count":1,"chunks_done":2,"chain":0}',
    ):
        with pytest.raises(CorruptionError, match="progress record"):
            Progress.decode(raw, key="k")


def test_chunks_keep_room_for_the_kv_records_they_carry() -> None:
    kv_max = KV_OVERHEAD_BYTES + committed_max_bytes(3)
    refs = _refs([2800] * 10)
    assert len(chunk_payloads(refs, 10_000)) == 4  # 3 payloads per chunk next to the progress record
    chunks = chunk_payloads(refs, 10_000, kv_max_bytes=kv_max)
    for c in chunks:
        assert kv_max + sum(p.size_bytes + APPEND_OVERHEAD_BYTES for p in c.payloads) <= 10_000
    assert len(chunks) == 5  # only 2 fit next to the committed-offsets record too


def test_committed_record_bound_holds_for_the_largest_offsets() -> None:
    for n in (1, 7, 10_000):
        record = Committed((2**63 - 1,) * n, "q" * 36, 2**62)
        assert len(record.encode()) <= committed_max_bytes(n)


def test_committed_ends_advance_by_the_whole_batch_and_resume_where_the_chunks_stopped() -> None:
    refs = _refs([4000] * 6)  # partitions 0,1,2,0,1,2 with 10..15 records
    chunks = chunk_payloads(refs, 10_000)
    assert len(chunks) == 3
    before = Committed((100, 200, 300), "q", 4)
    fresh = plan_batch(None, 5, chunks)
    assert expected_next_offsets(before, chunks, fresh) == [100, 200, 300]
    after = committed_after(before, chunks, fresh, query_id="q")
    assert after == Committed((100 + 10 + 13, 200 + 11 + 14, 300 + 12 + 15), "q", 5)
    # resumed after chunk 0 (payloads 0 and 1): those records are already in the streams
    resumed = plan_batch(progress_after(fresh, chunks, 0), 5, chunks)
    assert expected_next_offsets(before, chunks, resumed) == [110, 211, 300]
    # a replay of the complete batch writes nothing and expects the streams at the new ends
    done = plan_batch(progress_after(fresh, chunks, 2), 5, chunks)
    assert expected_next_offsets(after, chunks, done) == list(after.ends)
    assert Committed.decode(after.encode(), key="k", partition_count=3) == after


def test_bad_committed_record_is_corruption() -> None:
    for raw in (
        b"[]",
        b'{"version": 3, "ends": [0], "query_id": "q", "batch_id": 0}',
        b'{"version": 2, "ends": [0], "query_id": "q", "batch_id": 0}',  # v2 without discarded
        b'{"version": 1, "ends": [0, 1], "query_id": "q", "batch_id": 0}',
        b'{"version": 1, "ends": [-1], "query_id": "q", "batch_id": 0}',
        b'{"version": 1, "ends": ["x"], "query_id": "q", "batch_id": 0}',
    ):
        with pytest.raises(CorruptionError, match="committed-offsets record"):
            Committed.decode(raw, key="k", partition_count=1)


def test_version_1_progress_and_committed_records_still_read() -> None:
    v1 = b'{"version":1,"batch_id":7,"chunk_count":3,"chunks_done":1,"chain":42}'
    assert Progress.decode(v1, key="k") == Progress(7, 3, 1, 42, abandoned=False)
    v1c = b'{"version":1,"ends":[5,6],"query_id":"q","batch_id":7}'
    assert Committed.decode(v1c, key="k", partition_count=2) == Committed((5, 6), "q", 7, ())


def test_records_are_written_as_version_2_and_round_trip() -> None:
    progress = Progress(7, 3, 1, 42, abandoned=True)
    assert json.loads(progress.encode())["version"] == 2
    assert Progress.decode(progress.encode(), key="k") == progress
    committed = Committed(
        (10, 20), "q", 7, (DiscardedRange(0, 2, 4), DiscardedRange(0, 4, 6), DiscardedRange(1, 0, 20))
    )
    assert json.loads(committed.encode())["version"] == 2
    assert Committed.decode(committed.encode(), key="k", partition_count=2) == committed
    assert len(committed.encode()) <= committed_max_bytes(2, 3)
    writer = Writer("q", 7)
    assert Writer.decode(writer.encode(), key="k") == writer


def test_discarded_ranges_bound_holds_for_the_largest_offsets() -> None:
    ends = (2**63 - 1,) * 10_000
    ranges = tuple(DiscardedRange(9_999 - i, 2**62 + i, 2**63 - 1) for i in range(DISCARDED_RANGES_MAX))
    record = Committed(ends, "q" * 36, 2**62, tuple(sorted(ranges, key=lambda r: r.partition)))
    assert len(record.encode()) <= committed_max_bytes(10_000, DISCARDED_RANGES_MAX)


def test_bad_discarded_ranges_are_corruption() -> None:
    for ranges in (
        "[[1, 0, 1]]",  # no such partition
        "[[0, 3, 3]]",  # empty
        "[[0, 0, 11]]",  # past the end
        "[[0, 4, 6], [0, 5, 7]]",  # overlapping
        "[[0, 6, 7], [0, 1, 2]]",  # out of order
        "[[0, 1]]",
        '"x"',
    ):
        raw = f'{{"version":2,"ends":[10],"discarded":{ranges},"query_id":"q","batch_id":0}}'.encode()
        with pytest.raises(CorruptionError, match="committed-offsets record"):
            Committed.decode(raw, key="k", partition_count=1)
    for raw in (
        b'{"version":2,"batch_id":1,"chunk_count":2,"chunks_done":1,"chain":0,"abandoned":1}',
        b'{"version":2,"batch_id":1,"chunk_count":2,"chunks_done":2,"chain":0,"abandoned":true}',
    ):
        with pytest.raises(CorruptionError, match="progress record"):
            Progress.decode(raw, key="k")
    for raw in (
        b"{}",
        b'{"version":2,"query_id":"q","batch_id":0}',
        b'{"version":1,"query_id":1,"batch_id":0}',
    ):
        with pytest.raises(CorruptionError, match="writer record"):
            Writer.decode(raw, key="k")


def test_readers_skip_discarded_ranges() -> None:
    c = Committed(
        (100, 50), "q", 1, (DiscardedRange(0, 10, 20), DiscardedRange(0, 30, 40), DiscardedRange(1, 0, 5))
    )
    assert c.readable(0, 0, 100) == [(0, 10), (20, 30), (40, 100)]
    assert c.readable(0, 15, 35) == [(20, 30)]
    assert c.readable(0, 12, 18) == []
    assert c.readable(0, 40, 40) == []
    assert c.readable(1, 0, 50) == [(5, 50)]
    assert Committed((100,), "q", 1).readable(0, 3, 9) == [(3, 9)]


def test_an_abandoned_batch_is_refused_on_replay_and_later_batches_go_on() -> None:
    chunks = chunk_payloads(_refs([4000] * 6), 10_000)
    partial = progress_after(plan_batch(None, 5, chunks), chunks, 0)
    abandoned = Progress.decode(replace(partial, abandoned=True).encode(), key="k")
    assert not abandoned.unfinished
    with pytest.raises(ConflictError, match="micro-batch 5 was abandoned by an operator"):
        plan_batch(abandoned, 5, chunks)
    assert plan_batch(abandoned, 6, chunks).first_chunk == 0
    assert plan_batch(abandoned, 4, chunks).skip


def _states(committed: Committed, stream_ends: list[int]) -> tuple[PartitionState, ...]:
    return tuple(
        PartitionState(p, 100 + p, e, s)
        for p, (e, s) in enumerate(zip(committed.ends, stream_ends, strict=True))
    )


def test_plan_abandon_moves_the_ends_past_every_discarded_range_and_marks_the_batch() -> None:
    committed = Committed((10, 20, 30), "q0", 3, (DiscardedRange(1, 5, 20),))
    progress = Progress(4, 5, 2, 99)
    plan = plan_abandon("t", committed, _states(committed, [15, 25, 30]), query_id="q", progress=progress)
    assert plan.new_committed == Committed(
        (15, 25, 30), "q0", 3, (DiscardedRange(0, 10, 15), DiscardedRange(1, 5, 25))
    ), "[5, 20) and [20, 25) of partition 1 merge"
    assert plan.new_progress == Progress(4, 5, 2, 99, abandoned=True)
    assert plan.discard_count == 10
    assert set(plan.kv()) == {"spark_sink/topic/t/committed", "spark_sink/query/q/topic/t/progress"}
    # foreign records only: no progress record changes
    foreign = plan_abandon("t", committed, _states(committed, [11, 20, 30]), query_id=None, progress=None)
    assert set(foreign.kv()) == {"spark_sink/topic/t/committed"}
    # an unfinished batch with nothing past the ends (discarded before without its query) is still marked
    marked = plan_abandon("t", committed, _states(committed, [10, 20, 30]), query_id="q", progress=progress)
    assert marked.new_committed == committed
    with pytest.raises(NothingToDiscardError):
        plan_abandon("t", committed, _states(committed, [10, 20, 30]), query_id=None, progress=None)
    with pytest.raises(CorruptionError, match="below the committed end"):
        plan_abandon("t", committed, _states(committed, [9, 20, 30]), query_id=None, progress=None)


def test_progress_is_kept_per_query_and_topic() -> None:
    assert progress_key("q", "a") != progress_key("q", "b")
    kv = {progress_key("q", "a"): Progress(3, 2, 2, 7).encode()}
    empty = Committed.empty(2)
    assert load_progress(kv.get, "q", "a", empty) == Progress(3, 2, 2, 7)
    assert load_progress(kv.get, "q", "b", empty) is None, "another topic of the same query starts fresh"


def test_a_legacy_progress_record_counts_only_for_a_topic_its_query_wrote() -> None:
    legacy = Progress(5, 4, 2, 99)
    kv = {legacy_progress_key("q"): legacy.encode()}
    by_q = Committed((10, 10), "q", 4, ())
    by_other = Committed((10, 10), "other", 4, ())
    assert load_progress(kv.get, "q", "t", by_q) == legacy, "the committed record names the query"
    assert load_progress(kv.get, "q", "t", by_other) is None
    kv[writer_key("t")] = Writer("q", 5).encode()
    assert load_progress(kv.get, "q", "t", by_other) == legacy, "the writer record names the query"
    kv[progress_key("q", "t")] = Progress(6, 1, 1, 1).encode()
    assert load_progress(kv.get, "q", "t", by_q) == Progress(6, 1, 1, 1), "the per-topic record wins"


def test_the_kv_budget_holds_the_longest_progress_and_writer_records() -> None:
    query_id, topic = "q" * QUERY_ID_MAX_BYTES, "t" * 200  # the longest the sink and topics allow
    largest = 2**63 - 1
    progress = Progress(largest, largest, largest, 2**32 - 1, abandoned=False)
    writer = Writer(query_id, largest)
    records = [(progress_key(query_id, topic), progress.encode()), (writer_key(topic), writer.encode())]
    assert sum(KV_HEADER.size + len(k.encode()) + len(v) for k, v in records) <= KV_OVERHEAD_BYTES
