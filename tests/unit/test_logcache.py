"""LogCache: blocks, fullness, contiguous reads (full hit, tail hit, miss), freeing under pressure."""

from __future__ import annotations

from s3stream.engine.logcache import LogCache
from s3stream.record import StreamRecordBatch


def rec(stream_id: int, base: int, count: int = 1, size: int = 10) -> StreamRecordBatch:
    return StreamRecordBatch(stream_id, 0, base, count, bytes(size))


def offsets(records: list[StreamRecordBatch]) -> list[int]:
    return [r.base_offset for r in records]


def test_put_reports_full_at_the_threshold_and_archive_opens_a_new_block() -> None:
    cache = LogCache(capacity_bytes=10_000, upload_threshold_bytes=200, max_stream_count=100)
    assert not cache.put(rec(1, 0, size=100))  # 133 bytes with the header
    assert cache.put(rec(1, 1, size=100))
    block = cache.archive(now_s=1.0)
    assert block is not None
    assert block.archived
    assert cache.active is not block
    assert cache.active.is_empty()
    assert cache.archive(now_s=2.0) is None  # empty active block is not archived


def test_full_at_max_stream_count() -> None:
    cache = LogCache(capacity_bytes=10_000, upload_threshold_bytes=5_000, max_stream_count=2)
    assert not cache.put(rec(1, 0))
    assert cache.put(rec(2, 0))


def test_get_spans_blocks_and_returns_whole_batches() -> None:
    cache = LogCache(capacity_bytes=10_000, upload_threshold_bytes=5_000, max_stream_count=100)
    cache.put(rec(1, 0, count=3))
    cache.put(rec(2, 0))
    cache.archive(now_s=0)
    cache.put(rec(1, 3, count=2))
    cache.put(rec(1, 5))
    assert offsets(cache.get(1, 1, 6, max_bytes=1 << 20)) == [0, 3, 5]
    assert offsets(cache.get(1, 4, 5, max_bytes=1 << 20)) == [3]
    assert offsets(cache.get(1, 0, 6, max_bytes=15)) == [0, 3]  # the hint stops after the budget is spent
    assert offsets(cache.get(1, 0, 6, max_bytes=1)) == [0]  # at least one batch
    assert cache.get(3, 0, 1, max_bytes=100) == []
    assert cache.stream_end_offset(1) == 6


def test_get_returns_the_cached_tail_when_the_head_was_freed() -> None:
    cache = LogCache(capacity_bytes=200, upload_threshold_bytes=100, max_stream_count=100)
    cache.put(rec(1, 0, size=60))
    first = cache.archive(now_s=0)
    assert first is not None
    cache.put(rec(1, 1, size=60))
    cache.put(rec(1, 2, size=60))
    cache.mark_free(first)  # 3 * 93 bytes > 90 % of 200: the free head block goes
    assert first not in cache.blocks
    assert offsets(cache.get(1, 0, 3, max_bytes=1 << 20)) == [1, 2]  # the caller reads [0, 1) elsewhere
    assert cache.get(1, 0, 1, max_bytes=1 << 20) == []


def test_free_blocks_stay_readable_until_memory_pressure() -> None:
    cache = LogCache(capacity_bytes=10_000, upload_threshold_bytes=100, max_stream_count=100)
    cache.put(rec(1, 0))
    block = cache.archive(now_s=0)
    assert block is not None
    cache.mark_free(block)
    assert block in cache.blocks
    assert offsets(cache.get(1, 0, 1, max_bytes=100)) == [0]
    assert cache.unfree_bytes() == 0
    assert cache.has_room(10_000 - 1)  # frees the head block to make room
    assert block not in cache.blocks


def test_has_room_counts_unfree_blocks() -> None:
    cache = LogCache(capacity_bytes=300, upload_threshold_bytes=100, max_stream_count=100)
    cache.put(rec(1, 0, size=100))
    cache.put(rec(1, 1, size=100))
    assert not cache.has_room(100)
    assert cache.has_room(10)


def test_cached_records_are_invisible_to_the_garbage_collector_and_come_back_whole() -> None:
    import gc

    cache = LogCache(capacity_bytes=10_000, upload_threshold_bytes=5_000, max_stream_count=100)
    records = [rec(1, 0, count=2), rec(1, 2), rec(3, 0)]
    for record in records:
        cache.put(record)
    items = [item for stream in cache.active.streams.values() for item in stream.fields()]
    assert items == [(r.stream_id, r.epoch, r.base_offset, r.count, r.payload) for r in records]
    assert cache.active.streams[1].field(-1) == items[1]
    assert cache.active.streams[1].fields()[0:1] == items[:1]
    assert cache.active.records_by_stream() == [(1, records[:2]), (3, records[2:])]
    assert cache.get(1, 1, 3, max_bytes=1 << 20) == records[:2]
    payload = bytes(10)
    gc.collect()
    tracked = len(gc.get_objects())
    for base in range(3, 3003):  # columns: no object per record the collector tracks
        cache.put_plain(1, 0, base, 1, payload, -1)
    # one tracked object per record would add 3,000; the margin is for other threads (a background
    # loop another test left running) allocating between the two counts
    assert len(gc.get_objects()) - tracked < 500
    assert cache.get(1, 3001, 3003, max_bytes=1 << 20)[-1] == StreamRecordBatch(1, 0, 3002, 1, payload)


def test_a_block_keeps_the_wal_seq_of_each_record_put_with_one_and_hands_them_over_once() -> None:
    cache = LogCache(capacity_bytes=1 << 20, upload_threshold_bytes=1 << 20, max_stream_count=10)
    cache.put_item((1, 0, 0, 1, b"a"), 7)
    cache.put_item((2, 0, 0, 1, b"b"), 5)
    cache.put_item((1, 0, 1, 1, b"c"))  # no seq: not a WAL record of this process
    cache.put_item((1, 0, 2, 1, b"d"), 5)  # a second batch of record 5
    block = cache.archive(0.0)
    assert block is not None
    assert list(block.take_seqs()) == [7, 5, 5]
    assert list(block.take_seqs()) == []
    assert list(cache.active.seqs) == []


def test_a_stream_reopened_under_a_new_epoch_keeps_each_records_epoch_in_the_block() -> None:
    cache = LogCache(capacity_bytes=1 << 20, upload_threshold_bytes=1 << 20, max_stream_count=10)
    cache.put_plain(1, 4, 0, 2, b"old", 0)
    cache.put_plain(1, 5, 2, 1, b"new", 100)
    cache.put_item((1, 5, 3, 3, b"newer"))
    stream = cache.active.streams[1]
    assert stream.fields() == [(1, 4, 0, 2, b"old"), (1, 5, 2, 1, b"new"), (1, 5, 3, 3, b"newer")]
    assert stream.field(-1) == (1, 5, 3, 3, b"newer")
    assert (stream.start_offset, stream.end_offset, len(stream)) == (0, 6, 3)
    assert [(r.epoch, r.base_offset, r.count) for r in cache.get(1, 1, 4, max_bytes=1 << 20)] == [
        (4, 0, 2),
        (5, 2, 1),
        (5, 3, 3),
    ]
    assert (cache.active.wal_offset_min, cache.active.wal_bytes) == (0, 2 * 33 + 6)
