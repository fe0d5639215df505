"""How a taker cuts a dead node's replayed batches into upload groups (pure)."""

from __future__ import annotations

from s3stream.cluster.takeover import upload_groups
from s3stream.engine.recovery import ReplayPlan, plan_replay
from s3stream.engine.walbody import encode_plain
from s3stream.ids import StreamId
from s3stream.metadata.base import StreamMetadata, StreamState
from s3stream.record import RECORD_HEADER_SIZE, StreamRecordBatch


def _plan(stream_count: int, per_stream: int, payload_bytes: int) -> tuple[ReplayPlan, int]:
    records = []
    offset = 0
    for i in range(per_stream):
        for sid in range(stream_count):
            records.append((offset, encode_plain(StreamRecordBatch(sid, 5, i, 1, bytes(payload_bytes)))))
            offset += 1
    opening = [StreamMetadata(StreamId(sid), 5, StreamState.OPENED, 0, 0) for sid in range(stream_count)]
    return plan_replay(records, opening), RECORD_HEADER_SIZE + payload_bytes


def test_groups_hold_every_batch_once_each_stream_continuing_where_it_ended() -> None:
    plan, size = _plan(stream_count=3, per_stream=10, payload_bytes=100)
    groups = upload_groups(plan, group_bytes_max=7 * size, group_streams_max=100)
    assert len(groups) == 5  # 30 batches, 7 per group
    ends = {0: 0, 1: 0, 2: 0}
    for group in groups:
        assert [s.stream_id for s in group] == sorted(s.stream_id for s in group)
        assert sum(s.payload_bytes for s in group) <= 7 * 100
        for stream in group:
            assert stream.start_offset == ends[stream.stream_id]
            assert stream.epoch == 5
            ends[stream.stream_id] = stream.end_offset
    assert ends == {0: 10, 1: 10, 2: 10}


def test_a_group_holds_at_most_the_stream_limit() -> None:
    plan, _ = _plan(stream_count=5, per_stream=2, payload_bytes=10)
    groups = upload_groups(plan, group_bytes_max=1 << 30, group_streams_max=2)
    assert all(len(group) <= 2 for group in groups)
    assert sum(len(s.records) for group in groups for s in group) == 10


def test_an_empty_plan_uploads_nothing() -> None:
    plan, _ = _plan(stream_count=0, per_stream=0, payload_bytes=1)
    assert upload_groups(plan, group_bytes_max=1, group_streams_max=1) == []
