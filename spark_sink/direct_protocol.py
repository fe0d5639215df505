"""The direct path's exactly-once protocol, pure: offset plan, attempt slots, tiling check, commit contents.

On the direct path the executors write a micro-batch's objects themselves and the driver commits them
(``docs/spark-sink.md`` section "Direct writes"). What the driver decides, and checks before the one
metadata transaction that makes a micro-batch visible, lives here as plain functions over small
values, so each rule is a unit test:

- :class:`DirectProgress` (version 3): the last micro-batch of (query, topic) committed on the direct
  path. It lives under :func:`direct_progress_key`, in the KV namespace no WAL record ever writes: an
  engine's WAL replay can never put an older value back over it.
- :func:`plan_bases`: from the count pass's (task, partition) -> records, every task's absolute base
  offset per partition: tasks in task order, each partition continuing at its committed end.
- :class:`SlotTable`: the object ids prepared up front, ``slots_per_task`` per task; a task attempt
  takes the slot of its (stage attempt, task attempt), so retries and speculative attempts never write
  the same object key.
- :func:`check_tiling`: the winners' object descriptions cover every partition's planned range
  exactly, in task order (a missing, extra or shifted range is a ``ConflictError``, nothing committed).
- :func:`load_committed`: a topic's committed record is the newer of the one the driver path writes
  through the WAL and the one the direct path writes in its commit.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from s3stream.engine.kvlog import DIRECT_KV_PREFIX
from s3stream.errors import ConflictError, CorruptionError, InvalidArgumentError
from s3stream.metadata.controller import PREPARE_MAX_COUNT
from spark_sink.protocol import Committed, committed_key

DIRECT_PROGRESS_VERSION = 3
"""Version 3: the direct path's progress record (versions 1-2 are the driver path's chunk records)."""
DIRECT_KV_NAMESPACE = f"{DIRECT_KV_PREFIX}spark_sink/"
"""Prefix of every key the direct path writes: under the engine's direct-commit prefix, which its KV
path (the WAL) refuses, so these keys are written only by ``commit_objects``."""
SLOTS_PER_TASK = 16
"""Object ids prepared per task. A task attempt writes under the first slot from its attempt number
(``TaskContext.attemptNumber``: retries and speculative copies count up) whose create-only upload
succeeds; PySpark gives no stage attempt number, so a stage re-attempt starts again at slot 0 and
moves past the slots earlier attempts took. An attempt past the last slot fails the micro-batch
safely (nothing committed; the replay prepares new ids)."""

PREPARE_IDS_PER_CALL_MAX = PREPARE_MAX_COUNT
"""Ids one ``prepare_objects`` call may allocate: a micro-batch of more tasks prepares in several calls."""
assert PREPARE_IDS_PER_CALL_MAX >= SLOTS_PER_TASK


def direct_progress_key(query_id: str, topic: str) -> str:
    """The KV key of (query, topic)'s :class:`DirectProgress`."""
    return f"{DIRECT_KV_NAMESPACE}query/{query_id}/topic/{topic}/progress"


def direct_committed_key(topic: str) -> str:
    """The KV key of the committed record a direct micro-batch writes (same format as the driver
    path's, :class:`~spark_sink.protocol.Committed`)."""
    return f"{DIRECT_KV_NAMESPACE}topic/{topic}/committed"


@dataclass(frozen=True, slots=True)
class DirectProgress:
    """The last micro-batch of a query on a topic that the direct path committed."""

    batch_id: int

    def encode(self) -> bytes:
        return json.dumps(
            {"version": DIRECT_PROGRESS_VERSION, "batch_id": self.batch_id}, separators=(",", ":")
        ).encode()

    @classmethod
    def decode(cls, raw: bytes, *, key: str) -> DirectProgress:
        try:
            obj = json.loads(raw)
            if obj["version"] != DIRECT_PROGRESS_VERSION:
                raise ValueError(f"version {obj['version']}")
            batch_id = obj["batch_id"]
            if isinstance(batch_id, bool) or not isinstance(batch_id, int) or batch_id < 0:
                raise ValueError(f"batch_id {batch_id!r}")
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptionError(f"bad direct progress record: {exc}", source=f"kv:{key}") from exc
        return cls(batch_id)


def load_committed(get: Callable[[str], bytes | None], topic: str, partition_count: int) -> Committed:
    """The topic's committed record: the newer of the driver path's and the direct path's.

    Both only move forward (every partition's end at least the previous record's, discarded ranges
    only added), and each path starts from the newer one, so the newer is the one with the larger
    total of ends (on a tie: more discarded ranges). Nothing committed: ends 0.
    """
    best = Committed.empty(partition_count)
    for key in (committed_key(topic), direct_committed_key(topic)):
        raw = get(key)
        if raw is None:
            continue
        record = Committed.decode(raw, key=key, partition_count=partition_count)
        if (sum(record.ends), len(record.discarded)) > (sum(best.ends), len(best.discarded)):
            best = record
    return best


@dataclass(frozen=True, slots=True)
class TaskCount:
    """One row of the count pass: ``records`` rows (``payload_bytes`` of keys and values) of Spark
    partition ``task`` go to topic partition ``partition``; ``digest`` is their
    :func:`~spark_sink.direct_digest.rows_digest` (order-independent, additive)."""

    task: int
    partition: int
    records: int
    payload_bytes: int
    digest: int = 0


@dataclass(frozen=True, slots=True)
class PlannedRange:
    """One task's share of one partition: ``records`` rows from offset ``base``, whose digest the
    count pass found to be ``digest``."""

    partition: int
    base: int
    records: int
    digest: int

    @property
    def end(self) -> int:
        return self.base + self.records


TaskPlan = tuple[PlannedRange, ...]
"""One task's planned ranges, in partition order: all a write-pass task needs of the plan."""


@dataclass(frozen=True, slots=True)
class OffsetPlan:
    """Where each task's records go: ``bases[(task, partition)]`` is the absolute offset of the first
    record task ``task`` writes to ``partition``; the batch ends at ``ends``.

    ``task_plans`` indexes the same plan by task (built once, in O(entries)): every per-task look-up
    on the driver and on the executors is O(that task's partitions), never a scan of the plan.
    """

    start_ends: tuple[int, ...]
    ends: tuple[int, ...]
    bases: Mapping[tuple[int, int], int]
    counts: Mapping[tuple[int, int], int]
    task_plans: Mapping[int, TaskPlan]
    tasks: tuple[int, ...]
    """The tasks with records, in task order."""

    @property
    def record_count(self) -> int:
        return sum(self.counts.values())

    def task_partitions(self, task: int) -> tuple[int, ...]:
        """The partitions ``task`` writes to, in order."""
        return tuple(r.partition for r in self.task_plans.get(task, ()))


def plan_bases(counts: Sequence[TaskCount], start_ends: Sequence[int]) -> OffsetPlan:
    """Every (task, partition)'s base offset: partition ``p`` continues at ``start_ends[p]`` with the
    tasks' records in task order (a deterministic layout: the replay of a micro-batch whose rows
    are the same plans the same offsets). O(count rows x log)."""
    partition_count = len(start_ends)
    merged: dict[tuple[int, int], int] = {}
    digests: dict[tuple[int, int], int] = {}
    for c in counts:
        if not 0 <= c.partition < partition_count:
            raise InvalidArgumentError(f"count row for partition {c.partition} of {partition_count}")
        if c.records < 0 or c.task < 0:
            raise InvalidArgumentError(f"bad count row {c}")
        if c.records:
            key = (c.task, c.partition)
            merged[key] = merged.get(key, 0) + c.records
            digests[key] = digests.get(key, 0) + c.digest
    nxt = list(start_ends)
    bases: dict[tuple[int, int], int] = {}
    by_task: dict[int, list[PlannedRange]] = {}
    for task, partition in sorted(merged):
        key = (task, partition)
        bases[key] = nxt[partition]
        by_task.setdefault(task, []).append(
            PlannedRange(partition, nxt[partition], merged[key], digests[key])
        )
        nxt[partition] += merged[key]
    task_plans = {t: tuple(ranges) for t, ranges in by_task.items()}
    return OffsetPlan(tuple(start_ends), tuple(nxt), bases, merged, task_plans, tuple(by_task))


def prepare_call_sizes(task_count: int, slots_per_task: int = SLOTS_PER_TASK) -> list[int]:
    """The id counts of the ``prepare_objects`` calls for ``task_count`` tasks: whole tasks per call,
    at most :data:`PREPARE_IDS_PER_CALL_MAX` ids each (the metadata store's limit per call)."""
    per_call = tasks_per_prepare_call(slots_per_task)
    return [min(per_call, task_count - start) * slots_per_task for start in range(0, task_count, per_call)]


def tasks_per_prepare_call(slots_per_task: int = SLOTS_PER_TASK) -> int:
    """How many tasks' slots one ``prepare_objects`` call holds."""
    return PREPARE_IDS_PER_CALL_MAX // slots_per_task


@dataclass(frozen=True, slots=True)
class SlotTable:
    """Object ids prepared for a micro-batch, ``slots_per_task`` per task, in one ``prepare_objects``
    call per :func:`tasks_per_prepare_call` tasks (each call's ids are consecutive, the calls' are
    not). Task ``t`` at position ``i`` among the planned tasks is in call ``c = i //
    tasks_per_prepare_call()``; its slot ``s`` is ``first + (i - c * tasks_per_prepare_call()) *
    slots_per_task + s`` where ``first`` is ``first_id`` for call 0 and ``later_first_ids[c - 1]``
    after it."""

    first_id: int
    tasks: tuple[int, ...]
    slots_per_task: int = SLOTS_PER_TASK
    later_first_ids: tuple[int, ...] = ()
    _index: dict[int, int] = field(init=False, repr=False, compare=False)
    """task -> its position in ``tasks``, built once: :meth:`object_id` is O(1)."""

    def __post_init__(self) -> None:
        calls = len(prepare_call_sizes(len(self.tasks), self.slots_per_task))
        if len(self.later_first_ids) != max(0, calls - 1):
            raise InvalidArgumentError(
                f"{len(self.tasks)} tasks take {calls} prepare calls, got {1 + len(self.later_first_ids)} first ids"
            )
        object.__setattr__(self, "_index", {t: i for i, t in enumerate(self.tasks)})

    def __getstate__(self) -> tuple[int, tuple[int, ...], int, tuple[int, ...]]:
        return (self.first_id, self.tasks, self.slots_per_task, self.later_first_ids)

    def __setstate__(self, state: tuple[int, tuple[int, ...], int, tuple[int, ...]]) -> None:
        first_id, tasks, slots_per_task, later_first_ids = state
        object.__setattr__(self, "first_id", first_id)
        object.__setattr__(self, "tasks", tasks)
        object.__setattr__(self, "slots_per_task", slots_per_task)
        object.__setattr__(self, "later_first_ids", later_first_ids)
        self.__post_init__()

    @property
    def id_count(self) -> int:
        return len(self.tasks) * self.slots_per_task

    def object_id(self, task: int, slot: int) -> int:
        assert 0 <= slot < self.slots_per_task
        call, position = divmod(self._index[task], tasks_per_prepare_call(self.slots_per_task))
        first = self.first_id if call == 0 else self.later_first_ids[call - 1]
        return first + position * self.slots_per_task + slot

    def all_ids(self) -> Iterator[int]:
        """Every prepared id, call by call."""
        sizes = prepare_call_sizes(len(self.tasks), self.slots_per_task)
        for first, size in zip((self.first_id, *self.later_first_ids), sizes, strict=True):
            yield from range(first, first + size)


@dataclass(frozen=True, slots=True)
class TaskAssignment:
    """All a write-pass task needs of the plan: its ranges and the object id of its slot 0 (slot
    ``s`` is ``first_object_id + s``)."""

    ranges: TaskPlan
    first_object_id: int


def task_assignments(plan: OffsetPlan, slots: SlotTable) -> dict[int, TaskAssignment]:
    """Every planned task's :class:`TaskAssignment`, built in O(plan entries)."""
    return {t: TaskAssignment(plan.task_plans[t], slots.object_id(t, 0)) for t in plan.tasks}


def attempt_slots(task_attempt: int, slots_per_task: int = SLOTS_PER_TASK) -> range:
    """The slots a task attempt tries in order (empty past the last slot)."""
    return range(min(max(task_attempt, 0), slots_per_task), slots_per_task)


@dataclass(frozen=True, slots=True)
class WrittenRange:
    """One partition's records inside an uploaded object: ``[start_offset, end_offset)``."""

    partition: int
    start_offset: int
    end_offset: int
    size_bytes: int


@dataclass(frozen=True, slots=True)
class ObjectDescription:
    """What an executor reports for the object its task attempt uploaded (a few dozen bytes per range)."""

    task: int
    slot: int
    object_id: int
    size_bytes: int
    stream_object: bool
    ranges: tuple[WrittenRange, ...]


def check_tiling(
    plan: OffsetPlan, slots: SlotTable, objects: Sequence[ObjectDescription]
) -> list[ObjectDescription]:
    """The objects to commit, in task order, after checking they are exactly the plan.

    One object per planned task, its id the one of its slot, its ranges the task's planned ranges
    (partition order, each ``[base, base + count)``); so every partition's range ``[start end, end)``
    is tiled in task order. Anything else is a :class:`ConflictError` naming the first difference.
    """
    by_task: dict[int, ObjectDescription] = {}
    for o in objects:
        if o.task in by_task:
            raise ConflictError(
                f"two objects reported for Spark partition {o.task}: {by_task[o.task]} and {o}"
            )
        by_task[o.task] = o
    if set(by_task) != set(plan.tasks):
        raise ConflictError(
            f"objects reported for Spark partitions {sorted(by_task)}, the count pass planned {list(plan.tasks)}"
        )
    out: list[ObjectDescription] = []
    for task in plan.tasks:
        o = by_task[task]
        if o.object_id != slots.object_id(task, o.slot):
            raise ConflictError(f"Spark partition {task} reported object id {o.object_id} for slot {o.slot}")
        want = [(r.partition, r.base, r.end) for r in plan.task_plans[task]]
        got = [(r.partition, r.start_offset, r.end_offset) for r in o.ranges]
        if got != want:
            raise ConflictError(
                f"Spark partition {task} wrote ranges {got}, the plan is {want}: the micro-batch's rows "
                "changed between the count pass and the write pass"
            )
        if o.stream_object != (len(want) == 1):
            raise ConflictError(
                f"Spark partition {task}: stream_object={o.stream_object} for {len(want)} ranges"
            )
        out.append(o)
    return out


def committed_after_direct(
    committed: Committed, plan: OffsetPlan, *, query_id: str, batch_id: int
) -> Committed:
    """The committed record a direct micro-batch writes: the plan's ends, the discarded ranges kept."""
    assert plan.start_ends == committed.ends
    return Committed(plan.ends, query_id, batch_id, committed.discarded)
