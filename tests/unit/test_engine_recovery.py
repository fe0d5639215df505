"""plan_replay: which WAL batches come back after a restart (docs/format.md 5.3), case by case."""

from __future__ import annotations

import pytest

from s3stream.engine.recovery import plan_replay
from s3stream.engine.walbody import KvMutation, KvOp, encode_group, encode_kv, encode_plain
from s3stream.errors import CorruptionError
from s3stream.ids import StreamId
from s3stream.metadata.base import StreamMetadata, StreamState
from s3stream.record import StreamRecordBatch


def opened(stream_id: int, *, epoch: int, end: int) -> StreamMetadata:
    return StreamMetadata(StreamId(stream_id), epoch, StreamState.OPENED, 0, end)


def batch(stream_id: int, base: int, *, epoch: int = 1, count: int = 1) -> StreamRecordBatch:
    return StreamRecordBatch(stream_id, epoch, base, count, b"p%d" % base)


def offsets(plan: object) -> list[tuple[int, int]]:
    return [(b.stream_id, b.base_offset) for r in plan.records for b in r.batches]  # type: ignore[attr-defined]


def test_batches_from_the_committed_end_on_are_kept_in_order() -> None:
    wal = [(0, encode_plain(batch(1, 4))), (100, encode_plain(batch(1, 5))), (200, encode_plain(batch(1, 6)))]
    plan = plan_replay(wal, [opened(1, epoch=1, end=5)])
    assert offsets(plan) == [(1, 5), (1, 6)]
    assert plan.wal_end_offset == 201
    assert plan.dropped_batch_count == 1
    assert [r.wal_offset for r in plan.records] == [100, 200]


def test_streams_not_left_open_here_and_older_epochs_are_dropped() -> None:
    wal = [
        (0, encode_plain(batch(1, 0, epoch=0))),
        (50, encode_plain(batch(2, 0))),
        (90, encode_plain(batch(1, 0))),
    ]
    plan = plan_replay(wal, [opened(1, epoch=1, end=0)])
    assert offsets(plan) == [(1, 0)]


def test_a_gap_drops_the_stream_from_there_on() -> None:
    wal = [(0, encode_plain(batch(1, 0))), (10, encode_plain(batch(1, 2))), (20, encode_plain(batch(1, 3)))]
    plan = plan_replay(wal, [opened(1, epoch=1, end=0)])
    assert offsets(plan) == [(1, 0)]
    assert [(g.expected_offset, g.found_offset) for g in plan.gaps] == [(1, 2)]


def test_atomic_groups_replay_their_kv_puts_in_wal_order_and_keep_their_own_batches() -> None:
    wal = [
        (0, encode_group([batch(1, 0), batch(2, 7)], [("k", b"1")])),
        (64, encode_group([], [("k", b"2"), ("j", b"x")])),
    ]
    plan = plan_replay(wal, [opened(1, epoch=1, end=0), opened(2, epoch=1, end=8)])
    assert plan.kv_ops == tuple(
        KvMutation(KvOp.PUT, k, v) for k, v in (("k", b"1"), ("k", b"2"), ("j", b"x"))
    )
    assert offsets(plan) == [(1, 0)]  # stream 2's batch is below its committed end
    assert plan.records[0].body_size_bytes == len(wal[0][1])


def test_kv_mutation_bodies_and_group_puts_replay_in_one_wal_order() -> None:
    wal = [
        (0, encode_group([batch(1, 0)], [("k", b"old")])),
        (64, encode_kv([KvMutation(KvOp.PUT, "k", b"new"), KvMutation(KvOp.DELETE, "j")])),
        (96, encode_kv([KvMutation(KvOp.PUT_IF_ABSENT, "k", b"ignored")])),
    ]
    plan = plan_replay(wal, [opened(1, epoch=1, end=0)])
    assert plan.kv_ops == (
        KvMutation(KvOp.PUT, "k", b"old"),
        KvMutation(KvOp.PUT, "k", b"new"),
        KvMutation(KvOp.DELETE, "j"),
        KvMutation(KvOp.PUT_IF_ABSENT, "k", b"ignored"),
    )
    assert offsets(plan) == [(1, 0)]
    assert plan.wal_end_offset == 97


def test_a_damaged_body_is_corruption_naming_its_wal_offset() -> None:
    with pytest.raises(CorruptionError, match="at byte 4096"):
        plan_replay([(4096, b"\x01garbage")], [])


def test_an_empty_wal_replays_nothing() -> None:
    plan = plan_replay([], [opened(1, epoch=1, end=3)])
    assert (plan.records, plan.kv_ops, plan.wal_end_offset) == ((), (), 0)


def test_a_batch_ahead_of_its_predecessor_in_the_wal_is_held_until_it_arrives() -> None:
    # Offsets 1 and 2 were written before offset 0 (a write retried after "WAL full").
    wal = [
        (0, encode_plain(batch(1, 1))),
        (10, encode_group([batch(2, 0), batch(1, 2)], [])),
        (20, encode_plain(batch(1, 0))),
        (30, encode_plain(batch(1, 3))),
    ]
    plan = plan_replay(wal, [opened(1, epoch=1, end=0), opened(2, epoch=1, end=0)])
    assert [(b.stream_id, b.base_offset) for _, b in plan.release] == [(2, 0), (1, 0), (1, 1), (1, 2), (1, 3)]
    assert [plan.records[i].wal_offset for i, _ in plan.release] == [10, 20, 0, 10, 30]
    assert offsets(plan) == [(1, 1), (2, 0), (1, 2), (1, 0), (1, 3)]  # records in WAL order
    assert plan.gaps == ()
    assert plan.dropped_batch_count == 0


def test_batches_held_to_the_end_of_the_wal_are_a_gap() -> None:
    wal = [(0, encode_plain(batch(1, 0))), (10, encode_plain(batch(1, 3))), (20, encode_plain(batch(1, 2)))]
    plan = plan_replay(wal, [opened(1, epoch=1, end=0)])
    assert [b.base_offset for _, b in plan.release] == [0]
    assert [(g.expected_offset, g.found_offset) for g in plan.gaps] == [(1, 2)]
    assert plan.dropped_batch_count == 2
