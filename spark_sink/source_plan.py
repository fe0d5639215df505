"""Offset planning of the ``s3stream`` Spark source, pure: a topic snapshot in, offsets and ranges out.

The driver takes a :class:`TopicSnapshot` (``spark_sink.source_state``) and decides here where a
micro-batch ends (``latest_ends``: read-committed ends, capped by the rate limits) and which
offset ranges the executors read (``plan_ranges``: each partition's ``[start, end)`` minus the
ranges ``spark_sink abandon`` discarded).

Invariants:

* A planned end never exceeds the partition's readable end: the committed end of the sink's last
  finished micro-batch, and no further than the stream's uploaded end (what a reader in another
  process can fetch). So no record of an unfinished micro-batch is ever planned.
* Ends never move backwards: ``latest_ends(start, ...)[p] >= start[p]``.
* A rate-limited trigger with data available moves at least one record (the source cannot stall).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from s3stream.errors import InvalidArgumentError, OffsetOutOfRangeError
from s3stream.ids import StreamId
from spark_sink.protocol import Committed
from spark_sink.source_options import EARLIEST, LATEST, OffsetSpec


@dataclass(frozen=True, slots=True)
class TopicSnapshot:
    """A topic as the driver saw it at one moment."""

    topic: str
    stream_ids: tuple[StreamId, ...]
    """Index = partition."""
    start_offsets: tuple[int, ...]
    """Each stream's start offset (trimmed below)."""
    readable_ends: tuple[int, ...]
    """``min(committed end, uploaded end)`` per partition."""
    committed: Committed

    def __post_init__(self) -> None:
        n = len(self.stream_ids)
        assert len(self.start_offsets) == n
        assert len(self.readable_ends) == n
        assert len(self.committed.ends) == n
        assert all(e <= c for e, c in zip(self.readable_ends, self.committed.ends, strict=True))

    @property
    def partition_count(self) -> int:
        return len(self.stream_ids)

    def earliest(self, partition: int) -> int:
        """The lowest readable offset (a stream trimmed past its committed end reads from that end)."""
        return min(self.start_offsets[partition], self.readable_ends[partition])


@dataclass(frozen=True, slots=True)
class ReadRange:
    """Offsets ``[start_offset, end_offset)`` of one partition for one executor task to read."""

    partition: int
    stream_id: int
    start_offset: int
    end_offset: int


@dataclass(frozen=True, slots=True)
class SizedRange:
    """Offsets ``[start_offset, end_offset)`` of a stream in one object, and an upper bound of their bytes."""

    start_offset: int
    end_offset: int
    size_bytes: int


def resolve_offsets(spec: OffsetSpec, snap: TopicSnapshot, *, option: str) -> tuple[int, ...]:
    """Offsets for every partition from ``earliest`` / ``latest`` / a per-partition map."""
    n = snap.partition_count
    if spec == "earliest":
        return tuple(snap.earliest(p) for p in range(n))
    if spec == "latest":
        return snap.readable_ends
    assert isinstance(spec, Mapping)
    if set(spec) != set(range(n)):
        raise InvalidArgumentError(
            f"s3stream source: {option} must give every partition of topic {snap.topic!r} "
            f"(0..{n - 1}), got {sorted(spec)}"
        )
    out: list[int] = []
    for p in range(n):
        value = spec[p]
        if value == EARLIEST:
            out.append(snap.earliest(p))
        elif value == LATEST:
            out.append(snap.readable_ends[p])
        else:
            lo, hi = snap.earliest(p), snap.readable_ends[p]
            if not lo <= value <= hi:
                raise OffsetOutOfRangeError(
                    f"s3stream source: {option}: topic {snap.topic!r} partition {p}: offset {value} is "
                    f"outside the readable [{lo}, {hi}]"
                )
            out.append(value)
    return tuple(out)


def offsets_to_json(topic: str, offsets: Sequence[int]) -> dict[str, dict[str, int]]:
    """The offset as Spark checkpoints it: Kafka's ``{"<topic>": {"<partition>": offset}}``."""
    return {topic: {str(p): int(o) for p, o in enumerate(offsets)}}


def offsets_from_json(obj: Mapping[str, object], topic: str, partition_count: int) -> tuple[int, ...]:
    """Offsets from a checkpointed offset; InvalidArgumentError if it belongs to another topic or shape."""
    inner = obj.get(topic) if isinstance(obj, Mapping) else None
    if not isinstance(inner, Mapping) or set(inner) != {str(p) for p in range(partition_count)}:
        raise InvalidArgumentError(
            f"s3stream source: offset {obj!r} is not one of topic {topic!r} with {partition_count} partitions "
            "(a checkpoint of another topic?)"
        )
    out: list[int] = []
    for p in range(partition_count):
        value = inner[str(p)]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidArgumentError(f"s3stream source: offset {obj!r}: partition {p} is not an int >= 0")
        out.append(value)
    return tuple(out)


def cap_records(start: Sequence[int], available: Sequence[int], max_records: int) -> tuple[int, ...]:
    """Ends that move at most ``max_records`` records in total, shared in proportion to each
    partition's backlog (Kafka's ``maxOffsetsPerTrigger`` rule); the remainder goes to the
    partitions in order."""
    assert max_records >= 1
    backlog = [max(0, a - s) for s, a in zip(start, available, strict=True)]
    total = sum(backlog)
    if total <= max_records:
        return tuple(max(s, a) for s, a in zip(start, available, strict=True))
    take = [b * max_records // total for b in backlog]
    left = max_records - sum(take)
    for p, b in enumerate(backlog):
        if left == 0:
            break
        extra = min(left, b - take[p])
        take[p] += extra
        left -= extra
    return tuple(s + t for s, t in zip(start, take, strict=True))


def cap_bytes(
    start: Sequence[int],
    ends: Sequence[int],
    sizes: Sequence[Sequence[SizedRange]],
    max_bytes: int,
) -> tuple[int, ...]:
    """Ends that move at most about ``max_bytes`` (by the size bounds in ``sizes``), shared in
    proportion to each partition's bytes; at least one record when any is available.

    Inside a sized range bytes are taken as spread evenly over its offsets; offsets not covered by
    ``sizes`` are not taken (their size is unknown).
    """
    assert max_bytes >= 1
    n = len(start)
    backlog = [_bytes_between(sizes[p], start[p], ends[p]) for p in range(n)]
    total = sum(backlog)
    out: list[int] = []
    for p in range(n):
        budget = max_bytes if total <= max_bytes else max_bytes * backlog[p] // max(total, 1)
        out.append(_end_within(sizes[p], start[p], ends[p], budget))
    if all(o == s for o, s in zip(out, start, strict=True)):
        for p in range(n):
            if ends[p] > start[p]:
                out[p] = start[p] + 1
                break
    return tuple(out)


def _bytes_between(ranges: Sequence[SizedRange], start: int, end: int) -> int:
    total = 0
    for r in ranges:
        lo, hi = max(r.start_offset, start), min(r.end_offset, end)
        if lo < hi and r.end_offset > r.start_offset:
            total += r.size_bytes * (hi - lo) // (r.end_offset - r.start_offset)
    return total


def _end_within(ranges: Sequence[SizedRange], start: int, end: int, budget: int) -> int:
    """The highest offset in ``[start, end]`` whose records from ``start`` fit ``budget`` bytes."""
    pos = start
    for r in ranges:
        if r.end_offset <= pos:
            continue
        if r.start_offset > pos or pos >= end:
            break  # a gap in the sizes: stop before it
        hi = min(r.end_offset, end)
        span = r.end_offset - r.start_offset
        per_record = r.size_bytes / span if span else 0.0
        cost = per_record * (hi - pos)
        if cost <= budget:
            budget -= int(cost)
            pos = hi
            continue
        return pos + int(budget // per_record) if per_record else hi
    return pos


def plan_ranges(snap: TopicSnapshot, start: Sequence[int], end: Sequence[int]) -> list[ReadRange]:
    """The ranges executors read for ``[start, end)``: per partition, minus the discarded ranges.

    OffsetOutOfRangeError when a partition's range is no longer (trimmed) or not yet readable.
    """
    out: list[ReadRange] = []
    for p in range(snap.partition_count):
        lo, hi = start[p], end[p]
        if lo > hi:
            raise InvalidArgumentError(
                f"s3stream source: topic {snap.topic!r} partition {p}: start offset {lo} > end offset {hi}"
            )
        if lo == hi:
            continue
        if lo < snap.start_offsets[p] or hi > snap.committed.ends[p]:
            raise OffsetOutOfRangeError(
                f"s3stream source: topic {snap.topic!r} partition {p}: [{lo}, {hi}) is outside the "
                f"readable [{snap.start_offsets[p]}, {snap.committed.ends[p]}) (trimmed, or a checkpoint "
                "of another topic)"
            )
        for a, b in snap.committed.readable(p, lo, hi):
            out.append(ReadRange(p, int(snap.stream_ids[p]), a, b))
    return out
