"""The exactly-once planner, pure (no Spark, no engine): chunking and replay decisions."""

from __future__ import annotations

import pytest

from s3stream.errors import ConflictError, CorruptionError
from spark_sink.protocol import (
    APPEND_OVERHEAD_BYTES,
    KV_OVERHEAD_BYTES,
    Committed,
    PayloadRef,
    Progress,
    chunk_payloads,
    committed_after,
    committed_bytes_max,
    expected_next_offsets,
    plan_batch,
    progress_after,
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
    kv_max = KV_OVERHEAD_BYTES + committed_bytes_max(3)
    refs = _refs([2800] * 10)
    assert len(chunk_payloads(refs, 10_000)) == 4  # 3 payloads per chunk next to the progress record
    chunks = chunk_payloads(refs, 10_000, kv_bytes_max=kv_max)
    for c in chunks:
        assert kv_max + sum(p.size_bytes + APPEND_OVERHEAD_BYTES for p in c.payloads) <= 10_000
    assert len(chunks) == 5  # only 2 fit next to the committed-offsets record too


def test_committed_record_bound_holds_for_the_largest_offsets() -> None:
    for n in (1, 7, 10_000):
        record = Committed((2**63 - 1,) * n, "q" * 36, 2**62)
        assert len(record.encode()) <= committed_bytes_max(n)


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
        b'{"version": 2, "ends": [0], "query_id": "q", "batch_id": 0}',
        b'{"version": 1, "ends": [0, 1], "query_id": "q", "batch_id": 0}',
        b'{"version": 1, "ends": [-1], "query_id": "q", "batch_id": 0}',
        b'{"version": 1, "ends": ["x"], "query_id": "q", "batch_id": 0}',
    ):
        with pytest.raises(CorruptionError, match="committed-offsets record"):
            Committed.decode(raw, key="k", partition_count=1)
