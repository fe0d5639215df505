"""The exactly-once planner, pure (no Spark, no engine): chunking and replay decisions."""

from __future__ import annotations

import pytest

from s3stream.errors import ConflictError, CorruptionError
from spark_sink.protocol import (
    APPEND_OVERHEAD_BYTES,
    KV_OVERHEAD_BYTES,
    PayloadRef,
    Progress,
    chunk_payloads,
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
