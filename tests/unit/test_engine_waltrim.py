"""WalTrimTracker: the WAL is trimmed only below records whose every batch is committed."""

from __future__ import annotations

from s3stream.engine.waltrim import WalTrimTracker


def test_nothing_written_means_nothing_to_trim() -> None:
    assert WalTrimTracker().trim_point() is None


def test_trim_stops_at_the_oldest_live_record() -> None:
    t = WalTrimTracker()
    t.submitted(0, batch_count=1, size_bytes=100)
    t.submitted(1, batch_count=1, size_bytes=50)
    t.written(0, seq=0)
    t.written(124, seq=1)
    assert t.trim_point() == 0
    assert t.live_bytes == 150
    t.committed([1])  # the newer record first: the older one still holds the WAL
    assert t.trim_point() == 0
    t.committed([0])
    assert t.trim_point() == 125  # everything written so far
    assert t.live_bytes == 0
    assert len(t) == 0


def test_a_record_spanning_two_blocks_lives_until_both_commit() -> None:
    t = WalTrimTracker()
    t.submitted(0, batch_count=2, size_bytes=300)
    t.written(0, seq=0)
    t.committed([0])
    assert t.trim_point() == 0
    t.committed([0])
    assert t.trim_point() == 1


def test_an_append_in_flight_blocks_the_trim_until_its_offset_is_known() -> None:
    t = WalTrimTracker()
    t.submitted(0, batch_count=1, size_bytes=10, offset=0)
    assert t.trim_point() == 0
    t.submitted(1, batch_count=1, size_bytes=10)  # in flight
    t.committed([0])
    assert t.trim_point() is None


def test_failed_appends_hold_nothing() -> None:
    t = WalTrimTracker()
    t.submitted(0, batch_count=1, size_bytes=10)
    t.failed(0)
    t.failed(0)
    assert t.live_bytes == 0
    assert t.trim_point() is None


def test_the_bookkeeping_is_invisible_to_the_garbage_collector() -> None:
    import gc

    t = WalTrimTracker()
    for seq in range(100):
        t.submitted(seq, batch_count=2, size_bytes=10)
        t.written(seq * 10, seq=seq)
    assert not any(gc.is_tracked(d) for d in (t._offsets, t._batches, t._sizes))


def test_an_append_in_flight_bounds_the_trim_by_its_floor() -> None:
    t = WalTrimTracker()
    t.written(99)  # records up to offset 99 were written and are not live
    t.inflight[7] = t.end_offset  # submitted now: its offset will be at least 100
    t.inflight[8] = t.end_offset
    assert t.trim_point() == 100
    assert t.trim_point(cached_min=40) == 40
    del t.inflight[7], t.inflight[8]
    assert t.trim_point() == 100


def test_plain_appends_of_an_uncommitted_block_hold_the_wal_until_it_commits() -> None:
    t = WalTrimTracker()
    t.live_bytes += 2 * 37  # two plain appends submitted...
    t.written(500)  # ...written at 0 and 500, both in a block not yet committed (its lowest: 0)
    assert t.trim_point(cached_min=0) == 0
    t.released(2 * 37)  # the block committed: the caller no longer has a lowest offset to pass
    assert (t.trim_point(), t.live_bytes) == (501, 0)


def test_a_held_plain_append_holds_the_wal_until_released_into_a_block() -> None:
    t = WalTrimTracker()
    t.live_bytes += 37
    t.written(300)
    t.hold(4, 200)  # durable at 200, waiting for an earlier append of its stream
    assert t.trim_point() == 200
    assert t.trim_point(cached_min=250) == 200
    assert t.unhold(4) == 200  # now a per-block record: the block reports it
    assert t.trim_point(cached_min=200) == 200
    assert t.trim_point() == 301


def test_a_failed_held_plain_append_holds_nothing() -> None:
    t = WalTrimTracker()
    t.live_bytes += 37
    t.hold(4, 200)
    t.drop_held(4, 37)
    t.drop_held(4, 37)  # once only
    assert (t.trim_point(), t.live_bytes) == (None, 0)


def test_a_failed_plain_append_takes_back_its_bytes() -> None:
    t = WalTrimTracker()
    t.live_bytes += 37
    t.failed(3, 37)
    assert t.live_bytes == 0


def test_a_record_in_flight_without_a_floor_blocks_the_trim() -> None:
    t = WalTrimTracker()
    t.written(10)
    t.submitted(0, batch_count=1, size_bytes=10)  # no inflight entry: its offset is unbounded
    assert t.trim_point(cached_min=5) is None
    t.inflight[0] = t.end_offset
    assert t.trim_point(cached_min=50) == 11
