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


def test_a_plain_append_submitted_in_flight_is_a_one_batch_record() -> None:
    fast, general = WalTrimTracker(), WalTrimTracker()
    fast.submitted_one(0, 100)
    general.submitted(0, batch_count=1, size_bytes=100)
    fast.submitted(1, batch_count=3, size_bytes=50)
    general.submitted(1, batch_count=3, size_bytes=50)
    for t in (fast, general):
        assert t.trim_point() is None  # the first is in flight
        t.written(0, seq=0)
        t.written(124, seq=1)
        t.committed([0, 1, 1])
        assert (t.trim_point(), t.live_bytes, len(t)) == (124, 50, 1)
        t.committed([1, 0])  # a seq already gone is ignored
        assert (t.trim_point(), t.live_bytes, len(t)) == (125, 0, 0)
