"""The StreamSet object compaction planner: objects and stream metadata in, frozen plans out, no I/O.

AutoMQ's algorithm (``docs/automq-model.md`` section 9):

* blocks of deleted streams and blocks wholly below their stream's start offset are dropped;
* objects older than the force-split age are split, each on its own, into one stream object per
  run of contiguous blocks of one stream (one commit per object);
* the younger objects (newest first, at most ``objects_max``; only those sharing a stream with
  another candidate) are merged: per stream, every run of contiguous blocks but the last becomes a
  stream object (a gap cuts it out whatever its size), and the last run too when it is larger than
  the split size; the rest goes into one new StreamSet object. Limits on stream objects per commit
  and streams per StreamSet object exclude objects until they hold;
* the work is cut into steps of at most ``step_max_bytes`` block bytes, so an executor holds at most
  one step in memory whatever the input size. A stream object cut by a step boundary becomes two.

:func:`uncovered_blocks` is the sanity check run before a commit (``docs/automq-model.md`` section 9, step 5).
"""

from __future__ import annotations

import enum
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from s3stream.config import Config
from s3stream.errors import InvalidArgumentError
from s3stream.ids import ObjectId, StreamId
from s3stream.objectformat import IndexEntry

READ_SIZE_MAX_BYTES = 16 << 20
"""Largest single ranged GET of compaction (AutoMQ's S3_OBJECT_MAX_READ_BATCH)."""


@dataclass(frozen=True, slots=True)
class SourceObject:
    """A StreamSet object as the planner sees it: its metadata and its index."""

    object_id: ObjectId
    order_id: int
    data_time_ms: int
    size_bytes: int
    index: tuple[IndexEntry, ...]
    block_crcs: tuple[int, ...] | None = None
    """Carried for the executor (verification of the blocks it reads); the planner ignores it."""


@dataclass(frozen=True, slots=True)
class BlockRef:
    """One data block of a source object."""

    object_id: ObjectId
    entry: IndexEntry

    @property
    def stream_id(self) -> int:
        return self.entry.stream_id

    @property
    def size_bytes(self) -> int:
        return self.entry.size_bytes


@dataclass(frozen=True, slots=True)
class StreamObjectPlan:
    """A new stream object: contiguous blocks of one stream, in offset order."""

    stream_id: StreamId
    blocks: tuple[BlockRef, ...]

    @property
    def start_offset(self) -> int:
        return self.blocks[0].entry.start_offset

    @property
    def end_offset(self) -> int:
        return self.blocks[-1].entry.end_offset

    @property
    def size_bytes(self) -> int:
        return sum(b.size_bytes for b in self.blocks)


@dataclass(frozen=True, slots=True)
class PlanStep:
    """One memory-bounded slice: read these blocks, write these stream objects, and append
    ``stream_set_blocks`` (in (stream, offset) order) to the run's one output StreamSet object."""

    stream_objects: tuple[StreamObjectPlan, ...]
    stream_set_blocks: tuple[BlockRef, ...]

    @property
    def read_bytes(self) -> int:
        return sum(so.size_bytes for so in self.stream_objects) + sum(
            b.size_bytes for b in self.stream_set_blocks
        )

    def blocks(self) -> list[BlockRef]:
        out = [b for so in self.stream_objects for b in so.blocks]
        out.extend(self.stream_set_blocks)
        return out


class PlanKind(enum.Enum):
    COMPACT = "compact"
    FORCE_SPLIT = "force_split"


@dataclass(frozen=True, slots=True)
class CommitPlan:
    """Everything of one commit: the steps, and the StreamSet objects it replaces (marked destroyed)."""

    kind: PlanKind
    compacted_object_ids: tuple[ObjectId, ...]
    steps: tuple[PlanStep, ...]

    @property
    def read_bytes(self) -> int:
        return sum(s.read_bytes for s in self.steps)

    @property
    def has_stream_set_object(self) -> bool:
        return any(s.stream_set_blocks for s in self.steps)


@dataclass(frozen=True, slots=True)
class StreamSetCompactionPlan:
    force_splits: tuple[CommitPlan, ...]
    """One per object past the force-split age."""
    compaction: CommitPlan | None
    skipped_object_ids: tuple[ObjectId, ...]
    """Candidates left alone this run (limits, no shared stream, over ``objects_max``, oversized block)."""
    more_pending: bool
    """Candidates beyond ``objects_max`` were left: run again soon."""
    problem: str = ""
    """Why the merge was abandoned (overlapping blocks), if it was."""


@dataclass(frozen=True, slots=True)
class CompactionLimits:
    """The planner's limits, from :class:`~s3stream.config.Config` (AutoMQ key names in comments)."""

    memory_budget_bytes: int = 200 << 20  # s3.stream.set.object.compaction.cache.size
    stream_split_size_bytes: int = 8 << 20  # s3.stream.set.object.compaction.stream.split.size
    force_split_age_ms: int = 120 * 60_000  # s3.stream.set.object.compaction.force.split.minutes
    objects_max: int = 500  # s3.stream.set.object.compaction.max.num
    streams_per_stream_set_object_max: int = 20_000  # s3.max.stream.num.per.stream.set.object
    stream_objects_per_commit_max: int = 10_000  # s3.max.stream.object.num.per.commit
    writer_reserve_bytes: int = 16 << 20
    """Part of the budget kept for the output StreamSet object's upload, which is carried across steps:
    the executor passes it as that upload's ``buffer_max_bytes`` (:attr:`writer_buffer_max_bytes`)."""

    def __post_init__(self) -> None:
        for name in (
            "memory_budget_bytes",
            "stream_split_size_bytes",
            "force_split_age_ms",
            "objects_max",
            "streams_per_stream_set_object_max",
            "stream_objects_per_commit_max",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidArgumentError(f"compaction limit {name} must be a positive int, got {value!r}")
        if not 0 <= self.writer_reserve_bytes <= self.memory_budget_bytes // 2:
            raise InvalidArgumentError("writer_reserve_bytes must be in [0, memory_budget_bytes / 2]")

    @property
    def step_max_bytes(self) -> int:
        """Block bytes one step may read. A step's bytes are held at most twice (the GET buffers, and
        the copies in the step's stream-object uploads, which hold no more than is written to them
        and complete within the step), plus the reserve: ``2 * step + reserve <= budget``."""
        return (self.memory_budget_bytes - self.writer_reserve_bytes) // 2

    @property
    def writer_buffer_max_bytes(self) -> int:
        """``buffer_max_bytes`` of the output StreamSet object's upload: the reserve (at least 1; the
        storage never goes below one 5 MiB part, so budgets under 10 MiB overshoot by that floor)."""
        return max(1, self.writer_reserve_bytes)

    @classmethod
    def from_config(cls, config: Config) -> CompactionLimits:
        budget = config.stream_set_object_compaction_cache_size_bytes
        return cls(
            memory_budget_bytes=budget,
            stream_split_size_bytes=config.stream_set_object_compaction_stream_split_size_bytes,
            force_split_age_ms=config.stream_set_object_compaction_force_split_minutes * 60_000,
            objects_max=config.stream_set_object_compaction_max_num,
            streams_per_stream_set_object_max=config.max_stream_num_per_stream_set_object,
            stream_objects_per_commit_max=config.max_stream_object_num_per_commit,
            writer_reserve_bytes=min(2 * config.object_part_size_bytes, budget // 2),
        )


# ---------------------------------------------------------------------------------------------


class _Overlap(Exception):
    """Two blocks of one stream overlap: the merge is abandoned (AutoMQ treats it as fatal)."""


@dataclass(frozen=True, slots=True)
class _Unit:
    """An output unit in plan order: a stream object, or one stream's run for the StreamSet object."""

    split: bool
    blocks: tuple[BlockRef, ...]


def live_blocks(obj: SourceObject, start_offsets: Mapping[int, int]) -> list[BlockRef]:
    """Blocks of streams that still exist and that end above their stream's start offset."""
    out = []
    for e in obj.index:
        start = start_offsets.get(e.stream_id)
        if start is not None and e.end_offset > start:
            out.append(BlockRef(obj.object_id, e))
    return out


def plan_stream_set_compaction(
    objects: Sequence[SourceObject],
    start_offsets: Mapping[int, int],
    limits: CompactionLimits,
    *,
    now_ms: int,
) -> StreamSetCompactionPlan:
    """Plan one run over this node's StreamSet objects. ``start_offsets``: stream id -> start offset
    of every stream that exists (a stream missing from it is deleted)."""
    by_id = {o.object_id: o for o in objects}
    step_max = limits.step_max_bytes
    live = {oid: live_blocks(o, start_offsets) for oid, o in by_id.items()}
    skipped: list[ObjectId] = [
        oid for oid, o in by_id.items() if any(e.size_bytes > step_max for e in o.index)
    ]
    usable = [o for oid, o in by_id.items() if oid not in skipped]

    old = sorted(
        (o for o in usable if now_ms - o.data_time_ms >= limits.force_split_age_ms), key=lambda o: o.order_id
    )
    force_splits = []
    for o in old:
        units = [_Unit(True, run) for run in _runs(live[o.object_id])]
        force_splits.append(CommitPlan(PlanKind.FORCE_SPLIT, (o.object_id,), _cut_steps(units, step_max)))

    young = sorted(
        (o for o in usable if now_ms - o.data_time_ms < limits.force_split_age_ms),
        key=lambda o: (-o.data_time_ms, -o.order_id),
    )
    more_pending = len(young) > limits.objects_max
    skipped.extend(o.object_id for o in young[limits.objects_max :])
    young = young[: limits.objects_max]
    dead = [o.object_id for o in young if not live[o.object_id]]
    candidates = [o.object_id for o in young if live[o.object_id]]

    excluded: set[ObjectId] = set()
    try:
        while True:
            kept = _sharing_a_stream([oid for oid in candidates if oid not in excluded], live)
            units = _units([b for oid in kept for b in live[oid]], limits.stream_split_size_bytes)
            victims = _over_limits(units, kept, live, limits)
            if not victims:
                break
            excluded |= victims
    except _Overlap as exc:
        return StreamSetCompactionPlan(
            tuple(force_splits),
            None,
            tuple(skipped) + tuple(candidates) + tuple(dead),
            more_pending,
            str(exc),
        )
    skipped.extend(oid for oid in candidates if oid not in kept)
    compacted = tuple(sorted(kept + dead))
    compaction = CommitPlan(PlanKind.COMPACT, compacted, _cut_steps(units, step_max)) if compacted else None
    return StreamSetCompactionPlan(tuple(force_splits), compaction, tuple(skipped), more_pending)


def _sharing_a_stream(candidates: list[ObjectId], live: Mapping[ObjectId, list[BlockRef]]) -> list[ObjectId]:
    """Candidates holding at least one stream that another candidate holds too (docs/automq-model.md section
    9, step 3)."""
    holders: Counter[int] = Counter()
    streams_of = {oid: {b.stream_id for b in live[oid]} for oid in candidates}
    for streams in streams_of.values():
        holders.update(streams)
    return [oid for oid in candidates if any(holders[s] > 1 for s in streams_of[oid])]


def _runs(blocks: Iterable[BlockRef]) -> list[tuple[BlockRef, ...]]:
    """Sort by (stream, offset) and cut into runs of contiguous blocks of one stream."""
    ordered = sorted(blocks, key=lambda b: (b.entry.stream_id, b.entry.start_offset, b.entry.end_offset))
    runs: list[list[BlockRef]] = []
    for b in ordered:
        if runs and runs[-1][-1].stream_id == b.stream_id:
            last_end = runs[-1][-1].entry.end_offset
            if b.entry.start_offset < last_end:
                raise _Overlap(
                    f"stream {b.stream_id}: block [{b.entry.start_offset}, {b.entry.end_offset}) of object "
                    f"{b.object_id} overlaps block ending at {last_end} of object {runs[-1][-1].object_id}"
                )
            if b.entry.start_offset == last_end:
                runs[-1].append(b)
                continue
        runs.append([b])
    return [tuple(r) for r in runs]


def _units(blocks: list[BlockRef], split_size_bytes: int) -> list[_Unit]:
    """AutoMQ's grouping: per stream every run but the last is split out; the last if it is large."""
    runs = _runs(blocks)
    units = []
    for i, run in enumerate(runs):
        last_of_stream = i + 1 == len(runs) or runs[i + 1][0].stream_id != run[0].stream_id
        size = sum(b.size_bytes for b in run)
        units.append(_Unit(not last_of_stream or size > split_size_bytes, run))
    return units


def _over_limits(
    units: list[_Unit],
    kept: list[ObjectId],
    live: Mapping[ObjectId, list[BlockRef]],
    limits: CompactionLimits,
) -> set[ObjectId]:
    """Objects to exclude so the commit fits the limits (empty: it fits). docs/automq-model.md section 9, step
    3."""
    splits = [u for u in units if u.split]
    if len(splits) > limits.stream_objects_per_commit_max:
        smallest = min(splits, key=lambda u: (len(u.blocks), u.blocks[0].stream_id))
        return {b.object_id for b in smallest.blocks}
    compact_streams = {u.blocks[0].stream_id for u in units if not u.split}
    if len(compact_streams) > limits.streams_per_stream_set_object_max:
        streams_of = {oid: {b.stream_id for b in live[oid]} for oid in kept}
        dispersion: defaultdict[int, int] = defaultdict(int)
        for streams in streams_of.values():
            for s in streams:
                dispersion[s] += len(streams)
        least = min(compact_streams, key=lambda s: (dispersion[s], s))
        return {oid for oid, streams in streams_of.items() if least in streams}
    return set()


def _cut_steps(units: list[_Unit], step_max: int) -> tuple[PlanStep, ...]:
    """Walk the units in order, closing a step before it would exceed ``step_max`` block bytes; a
    unit crossing the boundary is cut between blocks (each block fits: checked by the caller)."""
    steps: list[PlanStep] = []
    splits: list[StreamObjectPlan] = []
    compact: list[BlockRef] = []
    used = 0

    def close() -> None:
        nonlocal splits, compact, used
        if splits or compact:
            steps.append(PlanStep(tuple(splits), tuple(compact)))
        splits, compact, used = [], [], 0

    for unit in units:
        pending = list(unit.blocks)
        while pending:
            taken = []
            while pending and used + pending[0].size_bytes <= step_max:
                used += pending[0].size_bytes
                taken.append(pending.pop(0))
            if taken:
                if unit.split:
                    splits.append(StreamObjectPlan(StreamId(taken[0].stream_id), tuple(taken)))
                else:
                    compact.extend(taken)
            if pending:
                close()
    close()
    return tuple(steps)


# ---------------------------------------------------------------------------------------------
# Sanity check (docs/automq-model.md section 9, step 5)


def uncovered_blocks(
    sources: Iterable[SourceObject],
    start_offsets: Mapping[int, int],
    new_ranges: Iterable[tuple[int, int, int]],
) -> list[BlockRef]:
    """Live blocks of the compacted objects that no new range covers. ``new_ranges``: (stream id,
    start, end) of the new StreamSet object's ranges and the new stream objects. Empty: safe."""
    by_stream: defaultdict[int, list[tuple[int, int]]] = defaultdict(list)
    for stream_id, start, end in new_ranges:
        by_stream[stream_id].append((start, end))
    merged: dict[int, list[tuple[int, int]]] = {}
    for stream_id, spans in by_stream.items():
        out: list[tuple[int, int]] = []
        for start, end in sorted(spans):
            if out and start <= out[-1][1]:
                out[-1] = (out[-1][0], max(out[-1][1], end))
            else:
                out.append((start, end))
        merged[stream_id] = out
    missing = []
    for obj in sources:
        for b in live_blocks(obj, start_offsets):
            e = b.entry
            if not any(s <= e.start_offset and e.end_offset <= t for s, t in merged.get(e.stream_id, ())):
                missing.append(b)
    return missing
