"""Hypothesis: for any set of StreamSet objects the planner's plans keep every live block exactly
once, respect the memory budget, write valid objects and pass the sanity check."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from compaction.plan import (
    CompactionLimits,
    SourceObject,
    live_blocks,
    plan_stream_set_compaction,
    uncovered_blocks,
)
from s3stream.ids import ObjectId
from s3stream.objectformat import IndexEntry

NOW = 1_000_000


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[SourceObject], dict[int, int], CompactionLimits]:
    object_count = draw(st.integers(1, 8))
    blocks: list[list[tuple[int, int, int, int]]] = [[] for _ in range(object_count)]
    ends: dict[int, int] = {}
    for stream in range(draw(st.integers(1, 5))):
        offset = 0
        for _ in range(draw(st.integers(0, 8))):
            offset += draw(st.sampled_from([0, 0, 0, 3]))  # sometimes a gap
            count = draw(st.integers(1, 5))
            size = draw(st.integers(40, 3000))
            blocks[draw(st.integers(0, object_count - 1))].append((stream, offset, offset + count, size))
            offset += count
        ends[stream] = offset
    objects = []
    for i, bs in enumerate(blocks):
        entries, position = [], 0
        for stream, start, end, size in sorted(bs):
            entries.append(IndexEntry(stream, start, end, end - start, position, size))
            position += size
        age = draw(st.sampled_from([0, 10, 10_000]))
        objects.append(SourceObject(ObjectId(i), i, NOW - age, position, tuple(entries)))
    start_offsets = {}
    for stream, end in ends.items():
        if draw(st.booleans()) or end == 0:
            start_offsets[stream] = draw(st.integers(0, max(end, 0)))
        elif draw(st.booleans()):
            start_offsets[stream] = 0
    limits = CompactionLimits(
        memory_budget_bytes=draw(st.sampled_from([6000, 10000, 1 << 20])),
        stream_split_size_bytes=draw(st.sampled_from([1, 2000, 1 << 20])),
        force_split_age_ms=5000,
        objects_max=draw(st.integers(1, 8)),
        streams_per_stream_set_object_max=draw(st.integers(1, 5)),
        stream_objects_per_commit_max=draw(st.integers(1, 10)),
        writer_reserve_bytes=0,
    )
    return objects, start_offsets, limits


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_plans_keep_every_live_block_once_within_the_budget(
    scenario: tuple[list[SourceObject], dict[int, int], CompactionLimits],
) -> None:
    objects, start_offsets, limits = scenario
    plan = plan_stream_set_compaction(objects, start_offsets, limits, now_ms=NOW)
    by_id = {o.object_id: o for o in objects}
    commits = [*plan.force_splits, *([plan.compaction] if plan.compaction else [])]
    ids = [oid for c in commits for oid in c.compacted_object_ids] + list(plan.skipped_object_ids)
    assert sorted(ids) == sorted(by_id), "every object is compacted, split or skipped exactly once"
    for commit in commits:
        sources = [by_id[oid] for oid in commit.compacted_object_ids]
        wanted = sorted(
            (b.object_id, b.entry.start_position) for o in sources for b in live_blocks(o, start_offsets)
        )
        got = sorted((b.object_id, b.entry.start_position) for s in commit.steps for b in s.blocks())
        assert got == wanted, "each live block of the compacted objects exactly once, nothing else"
        ranges: list[tuple[int, int, int]] = []
        stream_set = [b.entry for s in commit.steps for b in s.stream_set_blocks]
        for a, b in itertools.pairwise(stream_set):
            assert (a.stream_id, a.end_offset) <= (b.stream_id, b.start_offset), "StreamSet blocks in order"
            if a.stream_id == b.stream_id:
                assert a.end_offset == b.start_offset, "one contiguous range per stream"
        ranges += [(e.stream_id, e.start_offset, e.end_offset) for e in stream_set]
        for step in commit.steps:
            assert 0 < step.read_bytes <= limits.step_max_bytes
            for so in step.stream_objects:
                for x, y in itertools.pairwise(so.blocks):
                    assert x.stream_id == y.stream_id == so.stream_id
                    assert x.entry.end_offset == y.entry.start_offset
                ranges.append((so.stream_id, so.start_offset, so.end_offset))
        assert uncovered_blocks(sources, start_offsets, ranges) == []
        split_count = sum(len(s.stream_objects) for s in commit.steps)
        if commit.kind.value == "compact" and len(commit.steps) <= 1:
            assert split_count <= limits.stream_objects_per_commit_max
            assert len({e.stream_id for e in stream_set}) <= limits.streams_per_stream_set_object_max
