"""LogCache: a free block frozen into rows the garbage collector does not track, read the same."""

from __future__ import annotations

import gc
import random
from collections import Counter

from s3stream.engine.logcache import FrozenStreams, LogCache, LogCacheBlock
from s3stream.record import StreamRecordBatch


def filled(seed: int, *, streams: int = 20, records: int = 200) -> tuple[LogCache, LogCacheBlock]:
    """A cache whose first block (free) holds random records of ``streams`` streams, some of them
    reopened under a new epoch, and an active block continuing them."""
    rng = random.Random(seed)
    cache = LogCache(capacity_bytes=1 << 30, upload_threshold_bytes=1 << 30, max_stream_count=1 << 20)
    ends = [0] * streams
    epochs = [0] * streams
    for n in range(records):
        if n == records // 2:
            block = cache.archive(now_s=0)
        s = rng.randrange(streams)
        if rng.random() < 0.05:
            epochs[s] += 1
        count = rng.randint(1, 3)
        cache.put_plain(s * 7, epochs[s], ends[s], count, rng.randbytes(rng.randint(0, 20)), n)
        ends[s] += count
    assert block is not None
    cache.mark_free(block)
    return cache, block


def reads(cache: LogCache, block: LogCacheBlock) -> list[object]:
    """Everything a reader can see of the block and the cache."""
    out: list[object] = [block.records_by_stream(), list(block.streams), len(block.streams)]
    for stream_id in range(-1, 20 * 7 + 1):
        out.append(cache.stream_end_offset(stream_id))
        out.append(stream_id in block.streams)
        for start, end in [(0, 1 << 20), (3, 9), (20, 40), (35, 36), (60, 1 << 20)]:
            out.append(cache.get(stream_id, start, end, max_bytes=1 << 20))
            out.append(cache.get(stream_id, start, end, max_bytes=10))
        stream = block.streams.get(stream_id)
        if stream is not None:
            out.append((stream.start_offset, stream.end_offset, len(stream), stream.size_bytes))
            out.append((stream.fields(), stream.field(-1), stream.fields()[1:3], stream.records))
            out.append(stream.overlapping(5, 30))
    return out


def test_a_frozen_block_reads_exactly_as_before() -> None:
    for seed in range(20):
        cache, block = filled(seed)
        before = reads(cache, block)
        assert any(stream.epochs is not None for stream in block.streams.values())  # mixed epochs
        list(cache.freeze_steps(block, 3))
        assert isinstance(block.streams, FrozenStreams)
        assert reads(cache, block) == before, f"seed {seed}"


def test_a_frozen_block_keeps_nothing_per_stream_the_collector_tracks() -> None:
    cache, block = filled(1, streams=300, records=3000)
    list(cache.freeze_steps(block, 64))
    # A collection untracks a tuple whose items it found untracked (a row may come before its
    # payload tuple in the list it walks) and a dict once its values are: two full ones for all.
    gc.collect()
    gc.collect()
    assert isinstance(block.streams, FrozenStreams)
    assert not gc.is_tracked(block.streams.rows)
    assert not any(gc.is_tracked(row) for row in block.streams.rows.values())
    assert tracked_from(block) == {"LogCacheBlock": 1, "FrozenStreams": 1, "array": 1}  # the seqs


def tracked_from(root: object) -> dict[str, int]:
    """The objects the collector tracks that ``root`` reaches (types aside), counted by type."""
    seen: dict[int, object] = {}
    todo = [root]
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, type) or not gc.is_tracked(obj):
            continue
        seen[id(obj)] = obj
        todo.extend(gc.get_referents(obj))
    return dict(Counter(type(obj).__name__ for obj in seen.values()))


def test_an_unfrozen_block_keeps_tracked_objects_per_stream() -> None:
    """The contrast (a block still taking records): a StreamCache, its payload list and base offsets."""
    _, block = filled(1, streams=300, records=3000)
    gc.collect()
    gc.collect()
    assert tracked_from(block)["StreamCache"] == len(block.streams) == 300


def test_freezing_goes_a_slice_of_streams_per_step_and_swaps_at_the_end() -> None:
    cache, block = filled(2, streams=10, records=400)
    stream_count = len(block.streams)
    before = block.streams
    steps = cache.freeze_steps(block, 4)
    for _ in range(-(-stream_count // 4) - 1):
        next(steps)
        assert block.streams is before  # readable as it was between steps
    assert next(steps, "done") == "done"
    assert isinstance(block.streams, FrozenStreams)
    assert list(cache.freeze_steps(block, 4)) == []  # already frozen


def test_a_block_released_while_freezing_stays_unfrozen_and_hands_its_holders_over_once() -> None:
    cache, block = filled(3, streams=10, records=400)
    caches = list(block.streams.values())
    steps = cache.freeze_steps(block, 4)
    next(steps)
    assert cache.try_real_free(target_bytes=0) > 0
    assert block not in cache.blocks
    assert next(steps, "done") == "done"
    assert not isinstance(block.streams, FrozenStreams)
    assert block.take_holders() == caches
    assert block.take_holders() == []
    assert list(cache.freeze_steps(block, 4)) == []  # released before: nothing happens


def test_a_frozen_block_hands_its_rows_over_when_released() -> None:
    cache, block = filled(4)
    list(cache.freeze_steps(block, 8))
    assert isinstance(block.streams, FrozenStreams)
    rows = list(block.streams.rows.values())
    cache.try_real_free(target_bytes=0)
    holders = block.take_holders()
    assert len(holders) == len(rows)
    assert all(a is b for a, b in zip(holders, rows, strict=True))
    assert block.is_empty()


def test_a_frozen_stream_cache_is_a_copy_that_rebuilds_the_batches() -> None:
    cache = LogCache(capacity_bytes=1 << 20, upload_threshold_bytes=1 << 20, max_stream_count=10)
    cache.put_plain(1, 4, 0, 2, b"old", 0)
    cache.put_plain(1, 5, 2, 1, b"new", 1)
    block = cache.archive(now_s=0)
    assert block is not None
    cache.mark_free(block)
    list(cache.freeze_steps(block, 1))
    stream = block.streams[1]
    assert stream.records == [StreamRecordBatch(1, 4, 0, 2, b"old"), StreamRecordBatch(1, 5, 2, 1, b"new")]
    stream.add((1, 5, 3, 1, b"x"))  # a copy: the frozen row does not change
    assert block.streams[1].end_offset == 3
