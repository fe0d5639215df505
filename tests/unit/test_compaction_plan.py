"""The pure StreamSet compaction planner: tables of objects in, plans out (docs/automq-model.md section 9)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from compaction.plan import (
    CommitPlan,
    CompactionLimits,
    PlanKind,
    SourceObject,
    plan_stream_set_compaction,
    uncovered_blocks,
)
from s3stream.errors import InvalidArgumentError
from s3stream.ids import ObjectId
from s3stream.objectformat import IndexEntry

MiB = 1 << 20
NOW = 10_000_000
LIMITS = CompactionLimits(
    memory_budget_bytes=64 * MiB,
    stream_split_size_bytes=8 * MiB,
    writer_reserve_bytes=0,
    force_split_age_ms=60_000,
)


def obj(object_id: int, blocks: Sequence[tuple[int, int, int, int]], *, age_ms: int = 0) -> SourceObject:
    """A StreamSet object from (stream, start, end, size) blocks laid out back to back."""
    entries, position = [], 0
    for stream, start, end, size in blocks:
        entries.append(IndexEntry(stream, start, end, end - start, position, size))
        position += size
    return SourceObject(ObjectId(object_id), object_id, NOW - age_ms, position + 100, tuple(entries))


def shape(plan: CommitPlan) -> tuple[list[tuple[int, int, int]], list[tuple[int, int, int]]]:
    """(stream objects as (stream, start, end), StreamSet runs as (stream, start, end)) of a plan."""
    splits = [(so.stream_id, so.start_offset, so.end_offset) for s in plan.steps for so in s.stream_objects]
    runs: list[tuple[int, int, int]] = []
    for step in plan.steps:
        for b in step.stream_set_blocks:
            if runs and runs[-1][0] == b.stream_id and runs[-1][2] == b.entry.start_offset:
                runs[-1] = (b.stream_id, runs[-1][1], b.entry.end_offset)
            else:
                runs.append((b.stream_id, b.entry.start_offset, b.entry.end_offset))
    return splits, runs


def test_small_streams_merge_into_one_stream_set_object_and_large_ones_split() -> None:
    a = obj(1, [(1, 0, 10, 1 * MiB), (2, 0, 10, 5 * MiB)])
    b = obj(2, [(1, 10, 20, 1 * MiB), (2, 10, 20, 5 * MiB)])
    plan = plan_stream_set_compaction([a, b], {1: 0, 2: 0}, LIMITS, now_ms=NOW)
    assert plan.compaction is not None
    assert plan.compaction.compacted_object_ids == (1, 2)
    assert shape(plan.compaction) == ([(2, 0, 20)], [(1, 0, 20)])
    assert plan.force_splits == ()
    assert plan.skipped_object_ids == ()


def test_a_stream_exactly_at_the_split_size_stays_in_the_stream_set_object() -> None:
    a = obj(1, [(1, 0, 10, 4 * MiB)])
    b = obj(2, [(1, 10, 20, 4 * MiB)])
    plan = plan_stream_set_compaction([a, b], {1: 0}, LIMITS, now_ms=NOW)
    assert plan.compaction is not None
    assert shape(plan.compaction) == ([], [(1, 0, 20)])


def test_an_offset_gap_splits_the_run_before_it_whatever_its_size() -> None:
    a = obj(1, [(1, 0, 10, 100), (2, 0, 5, 100)])
    b = obj(2, [(1, 20, 30, 100), (2, 5, 9, 100)])
    plan = plan_stream_set_compaction([a, b], {1: 0, 2: 0}, LIMITS, now_ms=NOW)
    assert plan.compaction is not None
    assert shape(plan.compaction) == ([(1, 0, 10)], [(1, 20, 30), (2, 0, 9)])


def test_old_objects_are_force_split_one_commit_each_into_a_stream_object_per_run() -> None:
    old = obj(1, [(1, 0, 10, 100), (1, 10, 20, 100), (2, 0, 5, 100), (3, 7, 9, 100)], age_ms=60_000)
    young_a = obj(2, [(4, 0, 1, 100)])
    young_b = obj(3, [(4, 1, 2, 100)])
    plan = plan_stream_set_compaction([old, young_a, young_b], {1: 0, 2: 0, 3: 0, 4: 0}, LIMITS, now_ms=NOW)
    assert [p.compacted_object_ids for p in plan.force_splits] == [(1,)]
    split = plan.force_splits[0]
    assert split.kind == PlanKind.FORCE_SPLIT
    assert not split.has_stream_set_object
    assert shape(split) == ([(1, 0, 20), (2, 0, 5), (3, 7, 9)], [])
    assert plan.compaction is not None
    assert plan.compaction.compacted_object_ids == (2, 3)


def test_data_below_the_start_offset_and_of_deleted_streams_is_dropped() -> None:
    a = obj(1, [(1, 0, 10, 100), (1, 10, 20, 100), (2, 0, 10, 100), (9, 0, 10, 100)])
    b = obj(2, [(1, 20, 30, 100), (2, 10, 20, 100), (9, 10, 20, 100)])
    starts = {1: 15, 2: 10}  # stream 9 is deleted; stream 1 trimmed inside a block, stream 2 at a block edge
    plan = plan_stream_set_compaction([a, b], starts, LIMITS, now_ms=NOW)
    assert plan.compaction is not None
    assert shape(plan.compaction) == ([], [(1, 10, 30), (2, 10, 20)])


def test_objects_without_live_data_are_compacted_away_with_no_output() -> None:
    dead = obj(1, [(9, 0, 10, 100)])
    trimmed = obj(2, [(1, 0, 10, 100)])
    plan = plan_stream_set_compaction([dead, trimmed], {1: 10}, LIMITS, now_ms=NOW)
    assert plan.compaction is not None
    assert plan.compaction.compacted_object_ids == (1, 2)
    assert plan.compaction.steps == ()
    old_dead = obj(3, [(9, 0, 10, 100)], age_ms=10**9)
    plan = plan_stream_set_compaction([old_dead], {}, LIMITS, now_ms=NOW)
    assert [(p.compacted_object_ids, p.steps) for p in plan.force_splits] == [((3,), ())]


def test_objects_sharing_no_stream_with_another_candidate_are_left_alone() -> None:
    a = obj(1, [(1, 0, 10, 100)])
    b = obj(2, [(1, 10, 20, 100)])
    loner = obj(3, [(7, 0, 10, 100)])
    plan = plan_stream_set_compaction([a, b, loner], {1: 0, 7: 0}, LIMITS, now_ms=NOW)
    assert plan.compaction is not None
    assert plan.compaction.compacted_object_ids == (1, 2)
    assert plan.skipped_object_ids == (3,)


def test_the_memory_budget_cuts_the_work_into_several_steps() -> None:
    limits = CompactionLimits(
        memory_budget_bytes=20 * MiB, stream_split_size_bytes=64 * MiB, writer_reserve_bytes=0
    )
    objects = [obj(i, [(s, 10 * i, 10 * i + 10, 1 * MiB) for s in range(4)]) for i in range(10)]
    plan = plan_stream_set_compaction(objects, dict.fromkeys(range(4), 0), limits, now_ms=NOW)
    assert plan.compaction is not None
    steps = plan.compaction.steps
    assert limits.step_max_bytes == 10 * MiB  # half the budget: read buffers + writer copies
    assert len(steps) == 4  # 40 MiB of blocks, at most 10 MiB per step
    assert all(s.read_bytes <= limits.step_max_bytes for s in steps)
    assert shape(plan.compaction) == ([], [(s, 0, 100) for s in range(4)])
    blocks = [b for s in steps for b in s.blocks()]
    assert len(blocks) == len({(b.object_id, b.entry.start_position) for b in blocks}) == 40


def test_a_stream_object_crossing_a_step_boundary_becomes_two() -> None:
    limits = CompactionLimits(memory_budget_bytes=8 * MiB, stream_split_size_bytes=1, writer_reserve_bytes=0)
    a = obj(1, [(1, 0, 1, 3 * MiB)])
    b = obj(2, [(1, 1, 2, 3 * MiB)])
    plan = plan_stream_set_compaction([a, b], {1: 0}, limits, now_ms=NOW)
    assert plan.compaction is not None
    assert [shape(CommitPlan(PlanKind.COMPACT, (), (s,)))[0] for s in plan.compaction.steps] == [
        [(1, 0, 1)],
        [(1, 1, 2)],
    ]


def test_an_object_with_a_block_larger_than_the_budget_is_skipped() -> None:
    limits = CompactionLimits(memory_budget_bytes=4 * MiB, writer_reserve_bytes=0)
    a = obj(1, [(1, 0, 1, 3 * MiB)])
    b = obj(2, [(1, 1, 2, 100)])
    c = obj(3, [(1, 2, 3, 100)])
    plan = plan_stream_set_compaction([a, b, c], {1: 0}, limits, now_ms=NOW)
    assert 1 in plan.skipped_object_ids
    assert plan.compaction is not None
    assert plan.compaction.compacted_object_ids == (2, 3)


def test_too_many_stream_objects_per_commit_exclude_objects() -> None:
    limits = CompactionLimits(
        stream_split_size_bytes=1, stream_objects_per_commit_max=2, writer_reserve_bytes=0
    )
    a = obj(1, [(1, 0, 1, 100), (2, 0, 1, 100)])
    b = obj(2, [(1, 1, 2, 100), (2, 1, 2, 100)])
    e = obj(5, [(1, 2, 3, 100), (2, 2, 3, 100)])
    c = obj(3, [(3, 0, 1, 100)])
    d = obj(4, [(3, 1, 2, 100)])
    plan = plan_stream_set_compaction([a, b, c, d, e], {1: 0, 2: 0, 3: 0}, limits, now_ms=NOW)
    assert plan.compaction is not None
    assert shape(plan.compaction) == ([(1, 0, 3), (2, 0, 3)], [])  # stream 3 has the fewest blocks
    assert plan.compaction.compacted_object_ids == (1, 2, 5)
    assert sorted(plan.skipped_object_ids) == [3, 4]


def test_too_many_streams_per_stream_set_object_exclude_the_least_dispersed() -> None:
    limits = CompactionLimits(streams_per_stream_set_object_max=2, writer_reserve_bytes=0)
    a = obj(1, [(1, 0, 1, 100), (2, 0, 1, 100)])
    b = obj(2, [(1, 1, 2, 100), (2, 1, 2, 100)])
    c = obj(3, [(3, 0, 1, 100)])
    d = obj(4, [(3, 1, 2, 100)])
    plan = plan_stream_set_compaction([a, b, c, d], {1: 0, 2: 0, 3: 0}, limits, now_ms=NOW)
    assert plan.compaction is not None
    assert plan.compaction.compacted_object_ids == (1, 2)
    assert sorted(plan.skipped_object_ids) == [3, 4]


def test_at_most_objects_max_newest_candidates_and_the_rest_is_pending() -> None:
    limits = CompactionLimits(objects_max=2, writer_reserve_bytes=0)
    objects = [obj(i, [(1, i, i + 1, 100)], age_ms=1000 - i) for i in range(4)]
    plan = plan_stream_set_compaction(objects, {1: 0}, limits, now_ms=NOW)
    assert plan.more_pending
    assert plan.compaction is not None
    assert plan.compaction.compacted_object_ids == (2, 3)
    assert sorted(plan.skipped_object_ids) == [0, 1]


def test_overlapping_blocks_abandon_the_merge() -> None:
    a = obj(1, [(1, 0, 10, 100)])
    b = obj(2, [(1, 5, 15, 100)])
    plan = plan_stream_set_compaction([a, b], {1: 0}, LIMITS, now_ms=NOW)
    assert plan.compaction is None
    assert "overlaps" in plan.problem


def test_sanity_check_reports_live_blocks_no_new_range_covers() -> None:
    a = obj(1, [(1, 0, 10, 100), (1, 10, 20, 100), (2, 0, 10, 100), (9, 0, 5, 100)])
    assert uncovered_blocks([a], {1: 0, 2: 0}, [(1, 0, 10), (1, 10, 20), (2, 0, 10)]) == []
    missing = uncovered_blocks([a], {1: 0, 2: 0}, [(1, 0, 15), (2, 0, 10)])
    assert [(b.stream_id, b.entry.start_offset) for b in missing] == [(1, 10)]
    assert (
        uncovered_blocks([a], {1: 12, 2: 0}, [(1, 10, 20), (2, 0, 10)]) == []
    )  # trimmed part needs no cover


def test_limits_come_from_config_and_are_validated() -> None:
    from s3stream.config import Config

    limits = CompactionLimits.from_config(Config())
    assert limits.memory_budget_bytes == 200 * MiB
    assert limits.stream_split_size_bytes == 8 * MiB
    assert limits.force_split_age_ms == 120 * 60_000
    assert limits.objects_max == 500
    assert limits.step_max_bytes == (200 * MiB - 32 * MiB) // 2
    with pytest.raises(InvalidArgumentError):
        CompactionLimits(memory_budget_bytes=0)
    with pytest.raises(InvalidArgumentError):
        CompactionLimits(memory_budget_bytes=4 * MiB, writer_reserve_bytes=3 * MiB)
