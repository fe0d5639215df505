"""LogCache staging: plain puts go to the active block's staged list and are folded into its stream
caches every STAGED_ROWS_MAX records and whenever the block's streams are read; reads, sizes and
fullness are what putting each record straight into its stream cache gives."""

from __future__ import annotations

import random

import pytest

from s3stream.engine import logcache
from s3stream.engine.logcache import STAGED_FIELDS, LogCache, LogCacheBlock
from s3stream.model import RecordBatch
from s3stream.record import RECORD_HEADER_SIZE
from tests.unit.test_engine import Node


def test_plain_puts_are_staged_and_every_read_sees_them() -> None:
    cache = LogCache(capacity_bytes=1 << 20, upload_threshold_bytes=1 << 19, max_stream_count=100)
    for base in range(4):
        for stream_id in (1, 2, 3):
            assert not cache.put_plain(stream_id, 7, base, 1, b"p%d" % base, wal_offset=100 + base)
    block = cache.active
    assert not block.folded  # no stream cache touched by a put
    assert block.staged is not None
    assert len(block.staged) == 12 * STAGED_FIELDS
    assert block.size_bytes == cache.size_bytes == 12 * (RECORD_HEADER_SIZE + 2)
    assert block.wal_offset_min == 100
    assert not block.is_empty()
    assert [r.payload for r in cache.get(2, 1, 4, max_bytes=1 << 20)] == [b"p1", b"p2", b"p3"]
    assert block.staged == []
    assert list(block.folded) == [1, 2, 3]
    assert cache.put_plain(3, 7, 4, 2, b"x", wal_offset=200) is False
    assert cache.stream_end_offset(3) == 6  # folded by the look at the block's streams
    assert cache.blocks_with_stream(3) == [block]


def test_a_fold_comes_every_staged_rows_max_records(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logcache, "STAGED_ROWS_MAX", 4)
    cache = LogCache(capacity_bytes=1 << 20, upload_threshold_bytes=1 << 19, max_stream_count=100)
    for base in range(3):
        cache.put_plain(base % 2, 0, base // 2, 1, b"x", wal_offset=-1)
    assert not cache.active.folded
    cache.put_plain(1, 0, 1, 1, b"x", wal_offset=-1)
    assert cache.active.staged == []
    assert {s: c.end_offset for s, c in cache.active.folded.items()} == {0: 2, 1: 2}


def test_archive_folds_the_block_and_it_stages_no_more() -> None:
    cache = LogCache(capacity_bytes=1 << 20, upload_threshold_bytes=1 << 19, max_stream_count=100)
    cache.put_plain(5, 0, 0, 3, b"abc", wal_offset=0)
    block = cache.archive(now_s=1.0)
    assert block is not None
    assert block.staged is None
    assert block.folded[5].end_offset == 3
    assert cache.active.staged == []


@pytest.mark.parametrize("look", [False, True], ids=["unread", "read-after-each-put"])
def test_full_exactly_when_the_stream_count_reaches_the_limit(look: bool) -> None:
    for limit in (1, 2, 3, 5, 40):
        cache = LogCache(capacity_bytes=1 << 20, upload_threshold_bytes=1 << 19, max_stream_count=limit)
        ends: dict[int, int] = {}
        seq = 0
        for step in range(300):
            stream_id = step % 3 if step % 4 else 10 + step  # old streams, and now and then a new one
            base = ends.get(stream_id, 0)
            ends[stream_id] = base + 1
            if step % 5 == 0:  # a record put with a WAL seq (atomic group, replay) now and then
                full = cache.put_item((stream_id, 0, base, 1, b"r"), seq)
                seq += 1
            else:
                full = cache.put_plain(stream_id, 0, base, 1, b"r", wal_offset=step)
            assert full == (len(ends) >= limit), (limit, step)
            if look:  # a read folds the staged records
                assert len(cache.active.streams) == len(ends)
            if full:
                block = cache.archive(now_s=0)
                assert block is not None
                assert len(block.streams) == limit
                ends.clear()


def immediate(cache: LogCache) -> LogCache:
    """``cache`` with every put folded at once: what putting into the stream caches directly gives."""
    put_plain = cache.put_plain

    def put_and_fold(
        stream_id: int, epoch: int, base_offset: int, count: int, payload: bytes, wal_offset: int
    ) -> bool:
        full = put_plain(stream_id, epoch, base_offset, count, payload, wal_offset)
        cache.active.fold()
        return full or len(cache.active.folded) >= cache.max_stream_count

    cache.put_plain = put_and_fold  # type: ignore[method-assign]
    return cache


def block_state(block: LogCacheBlock) -> object:
    return (
        block.size_bytes,
        block.wal_offset_min,
        block.wal_bytes,
        list(block.seqs),
        [(s, c.records, c.size_bytes) for s, c in block.streams.items()],
    )


def test_reads_sizes_and_fullness_equal_those_of_putting_each_record_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(logcache, "STAGED_ROWS_MAX", 3)
    for seed in range(30):
        rng = random.Random(seed)
        limits = {"capacity_bytes": 1 << 20, "upload_threshold_bytes": rng.choice([300, 2_000, 1 << 19])}
        limits_count = rng.choice([2, 4, 100])
        staged = LogCache(**limits, max_stream_count=limits_count)
        direct = immediate(LogCache(**limits, max_stream_count=limits_count))
        ends: dict[int, int] = {}
        epochs: dict[int, int] = {}
        for step in range(300):
            op = rng.random()
            stream_id = rng.randrange(6)
            if op < 0.7:
                base = ends.get(stream_id, 0)
                count = rng.randint(1, 3)
                ends[stream_id] = base + count
                if rng.random() < 0.05:
                    epochs[stream_id] = epochs.get(stream_id, 0) + 1  # reopened under a new epoch
                item = (stream_id, epochs.get(stream_id, 0), base, count, rng.randbytes(rng.randint(0, 40)))
                if rng.random() < 0.15:
                    fulls = [c.put_item(item, seq=step) for c in (staged, direct)]
                else:
                    wal_offset = rng.randrange(1000)
                    fulls = [c.put_item(item, wal_offset=wal_offset) for c in (staged, direct)]
                assert fulls[0] == fulls[1], (seed, step)
                if fulls[0] or rng.random() < 0.02:
                    for c in (staged, direct):
                        c.archive(now_s=step)
            elif op < 0.9:
                start = rng.randrange(ends.get(stream_id, 0) + 2)
                end = start + rng.randint(1, 12)
                max_bytes = rng.choice([1, 50, 1 << 20])
                got = [c.get(stream_id, start, end, max_bytes) for c in (staged, direct)]
                assert got[0] == got[1], (seed, step)
            else:
                got = [
                    (c.stream_end_offset(stream_id), len(c.blocks_with_stream(stream_id)), c.size_bytes)
                    for c in (staged, direct)
                ]
                assert got[0] == got[1], (seed, step)
        assert [block_state(b) for b in staged.blocks] == [block_state(b) for b in direct.blocks], seed


async def test_the_append_hot_path_stages_its_record_and_fetch_reads_it() -> None:
    client = await Node().open()
    stream = await client.streams.create_and_open_stream()
    for n in range(5):
        assert await stream.append(RecordBatch(b"r%d" % n)) == n
    active = client.engine.cache.active
    assert active.staged is not None
    assert len(active.staged) == 5 * STAGED_FIELDS  # no fold yet: nothing read
    assert [b.payload for b in await stream.fetch(0, 5)] == [b"r0", b"r1", b"r2", b"r3", b"r4"]
    assert active.staged == []
    await client.close()
