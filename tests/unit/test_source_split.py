"""Splitting a source read into executor tasks at object boundaries (``spark_sink.source_split``)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from s3stream.errors import InvalidArgumentError
from spark_sink.source_options import TASK_BYTES_MAX_DEFAULT, parse_options
from spark_sink.source_plan import ReadRange, SizedRange
from spark_sink.source_split import ObjectSpan, share_object_sizes, split_tasks, task_bytes_target

BASE = {"topic": "t", "metadataUrl": "sqlite:///x/metadata.db"}


def _objects(p: int, bounds: list[int], size: int) -> list[SizedRange]:
    return [SizedRange(a, b, size) for a, b in itertools.pairwise(bounds)]


def test_small_partitions_make_one_task_each() -> None:
    ranges = [ReadRange(0, 7, 0, 100), ReadRange(1, 9, 0, 50)]
    sizes = {0: _objects(0, [0, 50, 100], 10), 1: _objects(1, [0, 50], 10)}
    assert split_tasks(ranges, sizes) == [(ranges[0],), (ranges[1],)]


def test_cuts_fall_on_object_ends_once_the_target_is_reached() -> None:
    ranges = [ReadRange(0, 7, 5, 95)]
    sizes = {0: _objects(0, [0, 20, 40, 60, 80, 100], 100)}
    # bytes per object inside [5, 95): 75, 100, 100, 100, 75
    tasks = split_tasks(ranges, sizes, task_bytes_max=150)
    assert tasks == [
        (ReadRange(0, 7, 5, 40),),
        (ReadRange(0, 7, 40, 80),),
        (ReadRange(0, 7, 80, 95),),
    ]


def test_a_cut_in_a_discarded_gap_starts_the_next_range_in_a_new_task() -> None:
    ranges = [ReadRange(0, 7, 0, 40), ReadRange(0, 7, 45, 100)]  # [40, 45) discarded
    sizes = {0: _objects(0, [0, 42, 100], 100)}
    assert split_tasks(ranges, sizes, task_bytes_max=50) == [
        (ReadRange(0, 7, 0, 40),),
        (ReadRange(0, 7, 45, 100),),
    ]


def test_min_partitions_lowers_the_target() -> None:
    ranges = [ReadRange(0, 7, 0, 100), ReadRange(1, 9, 0, 100)]
    bounds = list(range(0, 101, 10))
    sizes = {0: _objects(0, bounds, 10), 1: _objects(1, bounds, 10)}
    assert len(split_tasks(ranges, sizes)) == 2
    tasks = split_tasks(ranges, sizes, min_tasks=8)
    assert len(tasks) == 8
    assert [len(t) for t in tasks] == [1] * 8
    assert task_bytes_target(200, task_bytes_max=1000, min_tasks=8) == 25
    assert task_bytes_target(200, task_bytes_max=10, min_tasks=8) == 10
    assert task_bytes_target(0, task_bytes_max=10, min_tasks=8) == 1
    with pytest.raises(InvalidArgumentError):
        task_bytes_target(1, task_bytes_max=0, min_tasks=None)


def test_share_object_sizes_splits_a_streamset_object_by_records() -> None:
    spans = {
        0: [ObjectSpan(1, 0, 30, 1000), ObjectSpan(2, 30, 40, 500)],
        1: [ObjectSpan(1, 0, 10, 1000)],
    }
    assert share_object_sizes(spans) == {
        0: [SizedRange(0, 30, 750), SizedRange(30, 40, 500)],
        1: [SizedRange(0, 10, 250)],
    }


def test_options() -> None:
    opts = parse_options(BASE, streaming=True)
    assert (opts.task_bytes_max, opts.min_partitions) == (TASK_BYTES_MAX_DEFAULT, None)
    opts = parse_options({**BASE, "maxBytesPerTask": "4096", "minPartitions": "6"}, streaming=False)
    assert (opts.task_bytes_max, opts.min_partitions) == (4096, 6)
    for bad in ("0", "-1", "x"):
        with pytest.raises(InvalidArgumentError, match="maxBytesPerTask"):
            parse_options({**BASE, "maxBytesPerTask": bad}, streaming=True)
        with pytest.raises(InvalidArgumentError, match="minPartitions"):
            parse_options({**BASE, "minPartitions": bad}, streaming=True)


@st.composite
def _plans(draw: st.DrawFn) -> tuple[list[ReadRange], dict[int, list[SizedRange]], int, int | None]:
    ranges: list[ReadRange] = []
    sizes: dict[int, list[SizedRange]] = {}
    for p in range(draw(st.integers(1, 4))):
        bounds = sorted(set(draw(st.lists(st.integers(0, 200), min_size=2, max_size=12))))
        if len(bounds) < 2:
            continue
        sizes[p] = [SizedRange(a, b, draw(st.integers(0, 1000))) for a, b in itertools.pairwise(bounds)]
        # readable pieces inside the objects' span: cut points, every other gap discarded
        cuts = sorted(set(draw(st.lists(st.integers(bounds[0], bounds[-1]), max_size=6))))
        edges = [bounds[0], *cuts, bounds[-1]]
        for i, (a, b) in enumerate(itertools.pairwise(edges)):
            if a < b and (i % 2 == 0 or draw(st.booleans())):
                ranges.append(ReadRange(p, 100 + p, a, b))
    target = draw(st.integers(1, 3000))
    min_tasks = draw(st.none() | st.integers(1, 20))
    return ranges, sizes, target, min_tasks


def _offsets(ranges: list[ReadRange] | tuple[ReadRange, ...]) -> list[tuple[int, int, int]]:
    return sorted((r.partition, o, r.stream_id) for r in ranges for o in range(r.start_offset, r.end_offset))


@settings(max_examples=300, deadline=None)
@given(_plans())
def test_split_properties(plan: tuple[list[ReadRange], dict[int, list[SizedRange]], int, int | None]) -> None:
    ranges, sizes, target, min_tasks = plan
    tasks = split_tasks(ranges, sizes, task_bytes_max=target, min_tasks=min_tasks)
    # exactly the input offsets, each once
    flat = [r for t in tasks for r in t]
    assert _offsets(flat) == _offsets(ranges)
    assert len(set(_offsets(flat))) == len(_offsets(flat))
    object_ends = {p: {s.end_offset for s in sized} for p, sized in sizes.items()}
    previous: tuple[int, int] | None = None
    for t in tasks:
        assert t
        assert len({r.partition for r in t}) == 1
        assert all(r.start_offset < r.end_offset for r in t)
        assert all(a.end_offset <= b.start_offset for a, b in itertools.pairwise(t))
        key = (t[0].partition, t[0].start_offset)
        assert previous is None or key > previous
        if previous is not None and previous[0] == key[0]:
            # a task after a cut starts where an object ends, or at a range's own start
            starts = {r.start_offset for r in ranges if r.partition == key[0]}
            assert key[1] in object_ends[key[0]] or key[1] in starts
        previous = key
    # no cut at all when the target exceeds every partition's bytes
    huge = split_tasks(ranges, sizes, task_bytes_max=10**9)
    assert len(huge) == len({r.partition for r in ranges})
    # deterministic
    assert tasks == split_tasks(ranges, sizes, task_bytes_max=target, min_tasks=min_tasks)
