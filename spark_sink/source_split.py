"""Executor tasks of an ``s3stream`` source read, pure: planned ranges and object sizes in, tasks out.

A micro-batch's ranges (:func:`~spark_sink.source_plan.plan_ranges`) are grouped per topic
partition and, where a partition holds more than a task's share of bytes, cut into several tasks
at object boundaries, so a backlog in few partitions still spreads over every executor (Kafka's
source does the same with ``minPartitions``). Sizes come from the objects' metadata on the driver
(:func:`share_object_sizes` estimates each stream's part of a StreamSet object).

Invariants:

* The tasks' ranges are exactly the input ranges: the same offsets of the same partitions, each
  once, nothing added (a cut splits a range in two at an offset inside it).
* A task reads one partition, its ranges in offset order; tasks come in partition order, then
  offset order (the plan is deterministic: the same ranges and sizes give the same tasks).
* A cut lies on an object boundary (the end offset of a sized range), never inside an object, so no
  object is fetched by two tasks of one partition.
* Without a cut, a partition's ranges form one task: the plan of a topic whose partitions are all
  smaller than the target is one task per partition.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from s3stream.errors import InvalidArgumentError
from spark_sink.source_options import TASK_BYTES_MAX_DEFAULT
from spark_sink.source_plan import ReadRange, SizedRange


@dataclass(frozen=True, slots=True)
class ObjectSpan:
    """One object's part of a partition: offsets ``[start_offset, end_offset)`` and the object's
    whole size (a StreamSet object's size covers every stream in it)."""

    object_id: int
    start_offset: int
    end_offset: int
    object_size_bytes: int


def share_object_sizes(spans: Mapping[int, Sequence[ObjectSpan]]) -> dict[int, list[SizedRange]]:
    """Per partition, sized ranges whose sizes split each object's size over the topic's partitions
    in it, in proportion to their records (an object holding other topics' streams too is still
    counted whole for this topic's: an upper bound)."""
    records_in: dict[int, int] = {}
    for partition_spans in spans.values():
        for s in partition_spans:
            records_in[s.object_id] = records_in.get(s.object_id, 0) + max(0, s.end_offset - s.start_offset)
    out: dict[int, list[SizedRange]] = {}
    for partition, partition_spans in spans.items():
        sized: list[SizedRange] = []
        for s in partition_spans:
            total = records_in[s.object_id]
            share = s.object_size_bytes * (s.end_offset - s.start_offset) // total if total else 0
            sized.append(SizedRange(s.start_offset, s.end_offset, share))
        out[partition] = sized
    return out


def task_bytes_target(total_bytes: int, *, task_bytes_max: int, min_tasks: int | None) -> int:
    """Bytes per task: ``task_bytes_max``, or less so that ``total_bytes`` makes at least
    ``min_tasks`` tasks where the objects allow."""
    if task_bytes_max < 1:
        raise InvalidArgumentError(f"task_bytes_max must be >= 1, got {task_bytes_max}")
    if min_tasks is None or min_tasks <= 1:
        return task_bytes_max
    return max(1, min(task_bytes_max, -(-total_bytes // min_tasks)))


def split_tasks(
    ranges: Sequence[ReadRange],
    sizes: Mapping[int, Sequence[SizedRange]],
    *,
    task_bytes_max: int = TASK_BYTES_MAX_DEFAULT,
    min_tasks: int | None = None,
) -> list[tuple[ReadRange, ...]]:
    """The executor tasks reading ``ranges``: one per partition, or several where the partition's
    bytes (by ``sizes``, partition -> sized ranges in offset order) pass the target
    (:func:`task_bytes_target`). A task ends after the object that takes it to the target, so it
    holds at most the target plus one object. Offsets ``sizes`` does not cover count as 0 bytes."""
    by_partition: dict[int, list[ReadRange]] = {}
    for r in ranges:
        if r.end_offset > r.start_offset:
            by_partition.setdefault(r.partition, []).append(r)
    for rs in by_partition.values():
        rs.sort(key=lambda r: r.start_offset)
    total = sum(_bytes_in(sizes.get(p, ()), rs) for p, rs in by_partition.items())
    target = task_bytes_target(total, task_bytes_max=task_bytes_max, min_tasks=min_tasks)
    tasks: list[tuple[ReadRange, ...]] = []
    for p in sorted(by_partition):
        rs = by_partition[p]
        cuts = _cuts(sizes.get(p, ()), rs, target)
        tasks.extend(_cut_ranges(rs, cuts))
    return tasks


def _bytes_in(sized: Sequence[SizedRange], ranges: Sequence[ReadRange]) -> int:
    return sum(_overlap_bytes(s, r.start_offset, r.end_offset) for s in sized for r in ranges)


def _overlap_bytes(s: SizedRange, start: int, end: int) -> int:
    """``s``'s bytes inside ``[start, end)``, taken as spread evenly over its offsets."""
    lo, hi = max(s.start_offset, start), min(s.end_offset, end)
    span = s.end_offset - s.start_offset
    if lo >= hi or span <= 0:
        return 0
    return s.size_bytes * (hi - lo) // span


def _cuts(sized: Sequence[SizedRange], ranges: Sequence[ReadRange], target: int) -> list[int]:
    """Offsets where a new task begins: object ends strictly inside the partition's ranges, each
    taken once the bytes since the last cut reach ``target``."""
    first, last = ranges[0].start_offset, ranges[-1].end_offset
    cuts: list[int] = []
    since_cut = 0
    for s in sorted(sized, key=lambda s: s.start_offset):
        since_cut += sum(_overlap_bytes(s, r.start_offset, r.end_offset) for r in ranges)
        boundary = s.end_offset
        if since_cut >= target and first < boundary < last and (not cuts or boundary > cuts[-1]):
            cuts.append(boundary)
            since_cut = 0
    return cuts


def _cut_ranges(ranges: Sequence[ReadRange], cuts: Sequence[int]) -> list[tuple[ReadRange, ...]]:
    """``ranges`` (one partition, in order) split at ``cuts`` (ascending) into consecutive groups."""
    groups: list[list[ReadRange]] = [[]]
    bounds = list(cuts)
    for r in ranges:
        start = r.start_offset
        while bounds and bounds[0] <= start:
            bounds.pop(0)
            if groups[-1]:
                groups.append([])
        while bounds and bounds[0] < r.end_offset:
            cut = bounds.pop(0)
            groups[-1].append(ReadRange(r.partition, r.stream_id, start, cut))
            groups.append([])
            start = cut
        groups[-1].append(ReadRange(r.partition, r.stream_id, start, r.end_offset))
    return [tuple(g) for g in groups if g]
