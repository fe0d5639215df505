"""merge_fetch: the object-storage head and the LogCache tail of one fetch become one contiguous result."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from s3stream.engine.fetchmerge import merge_fetch
from s3stream.errors import CorruptionError, InvalidArgumentError
from s3stream.model import FetchedBatch
from s3stream.record import StreamRecordBatch


def batches(*ranges: tuple[int, int], size: int = 10) -> list[StreamRecordBatch]:
    """Batches of stream 1 for the given [base, end) ranges with ``size``-byte payloads."""
    return [StreamRecordBatch(1, 0, base, end - base, bytes([base % 256]) * size) for base, end in ranges]


def spans(result: list[StreamRecordBatch]) -> list[tuple[int, int]]:
    return [(b.base_offset, b.end_offset) for b in result]


def test_objects_head_and_cache_tail_join_in_order() -> None:
    objects = batches((0, 5), (5, 10))
    cached = batches((10, 12), (12, 20))
    got = merge_fetch(cached, objects, start_offset=3, end_offset=20, max_bytes=1 << 20)
    assert spans(got) == [(0, 5), (5, 10), (10, 12), (12, 20)]


def test_cache_holding_the_start_makes_objects_unneeded() -> None:
    cached = batches((10, 12), (12, 20))
    got = merge_fetch(cached, batches((0, 5)), start_offset=11, end_offset=20, max_bytes=1 << 20)
    assert spans(got) == [(10, 12), (12, 20)]


def test_objects_only_when_cache_is_empty() -> None:
    got = merge_fetch([], batches((0, 5), (5, 10)), start_offset=0, end_offset=10, max_bytes=1 << 20)
    assert spans(got) == [(0, 5), (5, 10)]


def test_object_batches_already_in_cache_are_not_repeated() -> None:
    objects = batches((0, 5), (5, 10), (10, 12))  # the reader went past the cache start
    cached = batches((10, 12), (12, 20))
    got = merge_fetch(cached, objects, start_offset=0, end_offset=20, max_bytes=1 << 20)
    assert spans(got) == [(0, 5), (5, 10), (10, 12), (12, 20)]


def test_stops_before_end_offset() -> None:
    got = merge_fetch(
        batches((10, 12), (12, 20)), batches((0, 10)), start_offset=0, end_offset=11, max_bytes=1 << 20
    )
    assert spans(got) == [(0, 10), (10, 12)]


def test_max_bytes_is_a_hint_with_at_least_one_batch() -> None:
    objects = batches((0, 5), (5, 10), size=100)
    cached = batches((10, 20), size=100)
    assert spans(merge_fetch(cached, objects, start_offset=0, end_offset=20, max_bytes=1)) == [(0, 5)]
    assert spans(merge_fetch(cached, objects, start_offset=0, end_offset=20, max_bytes=150)) == [
        (0, 5),
        (5, 10),
    ]
    assert spans(merge_fetch(cached, [], start_offset=10, end_offset=20, max_bytes=1)) == [(10, 20)]


def test_budget_spent_in_objects_does_not_require_the_cache_to_join() -> None:
    objects = batches((0, 5), size=100)  # the reader stopped at its byte budget
    cached = batches((10, 20))
    assert spans(merge_fetch(cached, objects, start_offset=0, end_offset=20, max_bytes=100)) == [(0, 5)]


def test_gap_between_objects_and_cache_is_corruption() -> None:
    with pytest.raises(CorruptionError, match=r"no data for \[5, 10\)"):
        merge_fetch(batches((10, 20)), batches((0, 5)), start_offset=0, end_offset=20, max_bytes=1 << 20)


def test_missing_objects_before_cache_is_corruption() -> None:
    with pytest.raises(CorruptionError):
        merge_fetch(batches((10, 20)), [], start_offset=3, end_offset=20, max_bytes=1 << 20)


def test_gap_inside_objects_is_corruption() -> None:
    with pytest.raises(CorruptionError, match="gap"):
        merge_fetch([], batches((0, 5), (6, 10)), start_offset=0, end_offset=10, max_bytes=1 << 20)


def test_overlap_with_cache_is_corruption() -> None:
    with pytest.raises(CorruptionError, match="overlap"):
        merge_fetch(batches((10, 20)), batches((0, 12)), start_offset=0, end_offset=20, max_bytes=1 << 20)


def test_first_batch_must_contain_start() -> None:
    with pytest.raises(CorruptionError, match="begins with"):
        merge_fetch([], batches((4, 10)), start_offset=2, end_offset=10, max_bytes=1 << 20)


def test_batches_wholly_before_start_are_skipped() -> None:
    got = merge_fetch([], batches((0, 2), (2, 6), (6, 9)), start_offset=3, end_offset=9, max_bytes=1 << 20)
    assert spans(got) == [(2, 6), (6, 9)]


def test_empty_range_and_bad_arguments() -> None:
    assert merge_fetch(batches((0, 5)), [], start_offset=4, end_offset=4, max_bytes=10) == []
    with pytest.raises(InvalidArgumentError):
        merge_fetch([], [], start_offset=5, end_offset=4, max_bytes=10)
    with pytest.raises(InvalidArgumentError):
        merge_fetch([], [], start_offset=0, end_offset=4, max_bytes=0)


def test_works_on_fetched_batches_too() -> None:
    objects = [FetchedBatch(0, 5, b"a"), FetchedBatch(5, 1, b"b")]
    cached = [FetchedBatch(6, 4, b"c")]
    got = merge_fetch(cached, objects, start_offset=1, end_offset=10, max_bytes=100)
    assert [b.payload for b in got] == [b"a", b"b", b"c"]


def reference(
    all_batches: list[StreamRecordBatch], start: int, end: int, max_bytes: int
) -> list[StreamRecordBatch]:
    """The model: scan the whole stream from the batch holding ``start``."""
    out: list[StreamRecordBatch] = []
    budget = max_bytes
    for b in all_batches:
        if b.end_offset <= start:
            continue
        if b.base_offset >= end or (out and budget <= 0):
            break
        out.append(b)
        budget -= len(b.payload)
    return out


@settings(max_examples=300, deadline=None)
@given(
    counts=st.lists(st.integers(1, 4), min_size=1, max_size=30),
    sizes=st.data(),
    cut=st.integers(0, 30),
    start_frac=st.floats(0, 1),
    end_frac=st.floats(0, 1),
    max_bytes=st.integers(1, 300),
)
def test_merge_equals_a_scan_of_the_whole_stream(
    counts: list[int], sizes: st.DataObject, cut: int, start_frac: float, end_frac: float, max_bytes: int
) -> None:
    base, all_batches = 0, []
    for count in counts:
        size = sizes.draw(st.integers(0, 40))
        all_batches.append(StreamRecordBatch(1, 0, base, count, b"p" * size))
        base += count
    total = base
    start = min(total - 1, int(start_frac * total))
    end = start + 1 + int(end_frac * (total - start - 1))
    cached = all_batches[min(cut, len(all_batches)) :]
    cache_start = cached[0].base_offset if cached else total
    # what the object reader returns for [start, cache_start) under the same byte hint
    from_objects = (
        reference(all_batches, start, min(end, cache_start), max_bytes) if start < cache_start else []
    )
    got = merge_fetch(cached, from_objects, start_offset=start, end_offset=end, max_bytes=max_bytes)
    assert got == reference(all_batches, start, end, max_bytes)
