"""LogCacheBlock.fold: the stream caches a fold makes enter the block's sorted streams in one update at
its end (not one sorted insert each), and the block reads as if every record had been put in line.
A frozen stream's row is one tuple with nothing the collector tracks in it."""

from __future__ import annotations

import gc
from typing import Any

from sortedcontainers import SortedDict

from s3stream.engine.logcache import LogCacheBlock, StreamCache


class CountingSortedDict(SortedDict):  # type: ignore[misc]
    """A SortedDict counting single-key inserts and bulk updates."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.setitem_count = 0
        self.update_count = 0

    def __setitem__(self, key: Any, value: Any) -> None:
        self.setitem_count += 1
        super().__setitem__(key, value)

    def update(self, *args: Any, **kwargs: Any) -> None:
        self.update_count += 1
        super().update(*args, **kwargs)


def _stage(block: LogCacheBlock, stream_id: int, epoch: int, base: int, payload: bytes) -> None:
    assert block.staged is not None
    block.staged += (stream_id, epoch, base, 1, payload)


def test_a_fold_adds_its_new_streams_in_one_update_of_the_sorted_streams() -> None:
    block = LogCacheBlock(0, 0.0)
    block.streams = CountingSortedDict()
    for base in range(3):
        for stream_id in (50, 7, 99, 3, 12):
            _stage(block, stream_id, 1, base, b"%d-%d" % (stream_id, base))
    block.fold()
    streams = block.folded
    assert isinstance(streams, CountingSortedDict)
    assert streams.setitem_count == 0
    assert streams.update_count == 1
    assert list(streams) == [3, 7, 12, 50, 99]
    assert streams[12].payloads == [b"12-0", b"12-1", b"12-2"]
    assert list(streams[12].bases) == [0, 1, 2]
    assert streams[12].end == 3


def test_a_fold_mixing_known_and_new_streams_keeps_offsets_epochs_and_order() -> None:
    block = LogCacheBlock(0, 0.0)
    for stream_id in (20, 10):
        _stage(block, stream_id, 1, 0, b"a")
    block.fold()
    _stage(block, 10, 1, 1, b"b")  # a known stream
    _stage(block, 15, 1, 0, b"c")  # new
    _stage(block, 15, 2, 1, b"d")  # the new stream reopened under epoch 2 within the same fold
    _stage(block, 5, 1, 0, b"e")  # new, sorts first
    _stage(block, 20, 1, 1, b"f")
    block.fold()
    streams = block.folded
    assert list(streams) == [5, 10, 15, 20]
    fifteen: StreamCache = streams[15]
    assert fifteen.fields() == [(15, 1, 0, 1, b"c"), (15, 2, 1, 1, b"d")]
    assert streams[10].fields() == [(10, 1, 0, 1, b"a"), (10, 1, 1, 1, b"b")]
    assert streams[20].end == 2
    assert block.staged == []


def test_a_frozen_row_is_one_tuple_holding_nothing_the_collector_tracks() -> None:
    block = LogCacheBlock(0, 0.0)
    for base in range(3):
        _stage(block, 4, 1, base, b"p%d" % base)
    block.fold()
    row = block.folded[4].row()
    assert not any(gc.is_tracked(item) for item in row)  # a tuple of payloads was one more per stream
    rebuilt = StreamCache.of_row(4, row)
    assert rebuilt.fields() == block.folded[4].fields()
