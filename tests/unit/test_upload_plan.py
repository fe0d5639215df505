"""plan_upload: AutoMQ's split rule over a block's streams (docs/automq-model.md section 5), on StreamGroup
columns."""

from __future__ import annotations

from s3stream.engine.upload import StreamGroup, StreamRecords, plan_upload

SPLIT = 100


def _stream(stream_id: int, payload_bytes: int) -> StreamRecords:
    return StreamRecords.of(stream_id, [(stream_id, 2, 10, 3, bytes(payload_bytes))] if payload_bytes else [])


def _ids(group: StreamGroup) -> list[int]:
    return [s.stream_id for s in group]


def test_large_streams_become_stream_objects_and_the_rest_one_stream_set_object() -> None:
    plan = plan_upload(
        [_stream(1, 10), _stream(2, SPLIT), _stream(5, 99), _stream(7, 500)], split_size_bytes=SPLIT
    )
    assert (_ids(plan.stream_set), _ids(plan.stream_objects)) == ([1, 5], [2, 7])
    assert plan.object_count == 3
    first = plan.stream_set[0]
    assert (first.epoch, first.start_offset, first.end_offset, first.payload_bytes) == (2, 10, 13, 10)


def test_one_stream_or_only_large_streams_make_no_stream_set_object() -> None:
    assert _ids(plan_upload([_stream(3, 1)], split_size_bytes=SPLIT).stream_objects) == [3]
    plan = plan_upload([_stream(3, SPLIT), _stream(4, SPLIT)], split_size_bytes=SPLIT)
    assert (len(plan.stream_set), _ids(plan.stream_objects)) == (0, [3, 4])


def test_streams_without_records_are_left_out() -> None:
    plan = plan_upload([_stream(1, 0), _stream(2, 5), _stream(3, 0)], split_size_bytes=SPLIT)
    assert (len(plan.stream_set), _ids(plan.stream_objects)) == (0, [2])
    assert plan_upload([], split_size_bytes=SPLIT).object_count == 0


def test_a_group_and_its_columns_plan_alike() -> None:
    streams = [_stream(1, 10), _stream(2, 200), _stream(4, 20)]
    group = StreamGroup.of_columns([1, 2, 4], [s.records for s in streams], [10, 200, 20])
    a, b = plan_upload(streams, split_size_bytes=SPLIT), plan_upload(group, split_size_bytes=SPLIT)
    assert (
        (_ids(a.stream_set), _ids(a.stream_objects))
        == (_ids(b.stream_set), _ids(b.stream_objects))
        == ([1, 4], [2])
    )
    assert _ids(group[1:]) == [2, 4]
    assert list(group) == streams
