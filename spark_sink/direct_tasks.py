"""The direct path's executor side: the write pass, inside ``mapInArrow``.

It runs over the persisted micro-batch (the sink's normalized rows with their row hashes) after the
count pass (:mod:`spark_sink.direct_count`, a Spark aggregation). It sends no payload byte to the
driver: one row per task attempt that wrote an object (:data:`WRITE_DDL`: its id, size and
per-partition ranges as a small JSON list). Each task reads only its own
:class:`~spark_sink.direct_protocol.TaskAssignment` (ranges and object ids), shipped as one Spark
broadcast of the whole plan (loaded once per Python worker) or inline: no task scans the plan.

The write pass encodes a task's rows into Kafka RecordBatch v2 payloads exactly as the driver path
does (:class:`~spark_sink.encode._Encoder`: same cut at ``batch_bytes_target``), but with absolute base
offsets: partition ``p`` of task ``t`` starts at the plan's base ``(t, p)``. Payloads are spooled per
partition (memory up to a bound, then a local temporary file) because an object holds its streams in
stream id order while a task's rows come in any order; then the task recounts and recomputes each
partition's row digest (:mod:`spark_sink.direct_digest`; a difference from the count pass fails the
micro-batch: the rows changed, e.g. a lost cache block recomputed from a source that does not replay
the same rows, even with the same counts) and uploads ONE object create-only under the id of its attempt's
slot: a stream object when the task holds one partition, else a StreamSet object.

``task_observer`` (a picklable callable in :class:`DirectOptions`, a no-op by default) is called on the
executor with ``(step, batch id, task, task attempt)`` at ``after_encode`` and ``after_upload``:
the tests use it to fail, slow down or kill a task attempt at those points.
"""

from __future__ import annotations

import json
import struct
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import IO, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from s3stream.direct.writer import write_object
from s3stream.errors import ConflictError
from s3stream.objectformat.writer import RecordFields
from spark_sink.direct_digest import DIGEST_COLUMN, rows_digest
from spark_sink.direct_protocol import SLOTS_PER_TASK, TaskAssignment, attempt_slots
from spark_sink.encode import PARTITION_COLUMN, EncodeOptions, _Encoder, _Pending, check_rows
from spark_sink.kafka_codec import encode_batch

WRITE_SCHEMA = pa.schema(
    [
        pa.field("task", pa.int32(), nullable=False),
        pa.field("slot", pa.int32(), nullable=False),
        pa.field("object_id", pa.int64(), nullable=False),
        pa.field("size_bytes", pa.int64(), nullable=False),
        pa.field("stream_object", pa.bool_(), nullable=False),
        pa.field("ranges", pa.string(), nullable=False),  # JSON [[partition, start, end, bytes], ...]
        pa.field("error", pa.string(), nullable=True),
    ]
)
WRITE_DDL = "task int, slot int, object_id bigint, size_bytes bigint, stream_object boolean, ranges string, error string"
SPOOL_MEMORY_BYTES_MAX = 64 << 20
"""Payload bytes a task keeps in memory across its partitions' spools before they go to local files."""
_SPOOL_ENTRY = struct.Struct(
    ">"
    "q"  # base offset
    "i"  # record count
    "i"  # payload bytes that follow
)


class SharedValue(Protocol):
    """A value shipped once to each executor (``pyspark.Broadcast``)."""

    @property
    def value(self) -> Mapping[int, TaskAssignment]: ...


TaskObserver = Callable[[str, int, int, int], None]
"""``(step, batch id, task, task attempt)``, called on the executor at ``after_encode`` and
``after_upload``."""


def no_task_observer(step: str, batch_id: int, task: int, task_attempt: int) -> None:
    """The default :data:`TaskObserver`: does nothing."""


@dataclass(frozen=True, slots=True)
class DirectOptions:
    """What the write pass's tasks need (pickled into the task closure): a few values per task."""

    encode: EncodeOptions
    bucket_uri: str = field(repr=False)
    """May carry S3 credentials: never in a repr (a log line or an error message)."""
    namespace: str
    stream_ids: tuple[int, ...]
    """Index = partition."""
    stream_epochs: tuple[int, ...]
    assignments: Mapping[int, TaskAssignment] | SharedValue
    """task -> its assignment; a Spark ``Broadcast`` of that mapping on a cluster."""
    slots_per_task: int = SLOTS_PER_TASK
    task_observer: TaskObserver = field(default=no_task_observer)

    def assignment(self, task: int) -> TaskAssignment | None:
        """``task``'s assignment (None: the count pass saw no rows in it). O(1)."""
        shared = self.assignments
        mapping = shared if isinstance(shared, Mapping) else shared.value
        return mapping.get(task)


class _Spool:
    """One partition's payloads of a task, in offset order: memory, then a local temporary file."""

    def __init__(self, memory_bytes_max: int) -> None:
        self.file: IO[bytes] = tempfile.SpooledTemporaryFile(max_size=memory_bytes_max)  # noqa: SIM115
        self.records = 0
        self.bytes = 0

    def add(self, base: int, count: int, payload: bytes) -> None:
        self.file.write(_SPOOL_ENTRY.pack(base, count, len(payload)))
        self.file.write(payload)
        self.records += count
        self.bytes += len(payload)

    def read(self, stream_id: int, epoch: int) -> Iterator[RecordFields]:
        self.file.seek(0)
        while True:
            head = self.file.read(_SPOOL_ENTRY.size)
            if not head:
                return
            base, count, size = _SPOOL_ENTRY.unpack(head)
            yield (stream_id, epoch, base, count, self.file.read(size))

    def close(self) -> None:
        self.file.close()


class _DirectEncoder(_Encoder):
    """The driver path's encoder, emitting each Kafka batch at its absolute offset into a spool."""

    def __init__(self, options: DirectOptions, task: int, assignment: TaskAssignment | None) -> None:
        super().__init__(options.encode, task)
        self.direct = options
        ranges = () if assignment is None else assignment.ranges
        self.next_offset = {r.partition: r.base for r in ranges}
        memory = SPOOL_MEMORY_BYTES_MAX // max(1, len(ranges))
        self.spools: dict[int, _Spool] = {}
        self.memory = memory
        self.unplanned: int | None = None

    def _emit(self, partition: int, p: _Pending) -> None:
        base = self.next_offset.get(partition)
        if base is None:  # rows for a partition the count pass did not see: fail the batch
            self.unplanned = partition
            return
        payload = encode_batch(p.keys, p.values, p.timestamps_ms, p.headers, base_offset=base)
        spool = self.spools.get(partition)
        if spool is None:
            spool = self.spools[partition] = _Spool(self.memory)
        spool.add(base, len(p.values), bytes(payload))
        self.next_offset[partition] = base + len(p.values)

    def take_output(self) -> pa.RecordBatch | None:
        return None

    def close(self) -> None:
        for spool in self.spools.values():
            spool.close()
        self.spools.clear()


def _write_error(task: int, message: str) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {
            "task": [task],
            "slot": [-1],
            "object_id": [-1],
            "size_bytes": [0],
            "stream_object": [False],
            "ranges": ["[]"],
            "error": [message],
        },
        schema=WRITE_SCHEMA,
    )


def write_partition(
    options: DirectOptions,
    task: int,
    task_attempt: int,
    batches: Iterator[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    """The write pass of one task attempt: encode, recount and digest, upload one object, describe it."""
    where = f"micro-batch {options.encode.batch_id}, Spark partition {task}"
    assignment = options.assignment(task)
    planned = () if assignment is None else assignment.ranges
    encoder = _DirectEncoder(options, task, assignment)
    digests: dict[int, int] = {}
    try:
        for rows in batches:
            message = check_rows(rows, options.encode)
            if message is not None:
                yield _write_error(task, f"{message} (Spark partition {task})")
                return
            part = rows.column(PARTITION_COLUMN)
            for target in sorted(pc.unique(part).to_pylist()):
                mine = rows if options.encode.partition_count == 1 else rows.filter(pc.equal(part, target))
                digests[target] = digests.get(target, 0) + rows_digest(mine.column(DIGEST_COLUMN))
                encoder.add(target, mine)
        encoder.finish()
        got = {p: (s.records, digests.get(p, 0)) for p, s in encoder.spools.items()}
        want = {r.partition: (r.records, r.digest) for r in planned}
        if encoder.unplanned is not None or got != want:
            yield _write_error(task, _changed_message(where, got, want))
            return
        if assignment is None:
            return
        options.task_observer("after_encode", options.encode.batch_id, task, task_attempt)
        order = sorted(planned, key=lambda r: options.stream_ids[r.partition])

        def records() -> Iterator[RecordFields]:
            for r in order:
                p = r.partition
                yield from encoder.spools[p].read(options.stream_ids[p], options.stream_epochs[p])

        written = None
        for slot in attempt_slots(task_attempt, options.slots_per_task):
            object_id = assignment.first_object_id + slot
            try:
                size = write_object(options.bucket_uri, options.namespace, object_id, records()).size_bytes
            except ConflictError:  # another attempt created this slot's object: take the next slot
                continue
            written = (slot, object_id, size)
            break
        if written is None:
            yield _write_error(
                task,
                f"{where}: attempt {task_attempt} found no free object id slot of "
                f"{options.slots_per_task}; the micro-batch fails and its replay prepares new ids",
            )
            return
        slot, object_id, size = written
        options.task_observer("after_upload", options.encode.batch_id, task, task_attempt)
        ranges = [[r.partition, r.base, r.end, encoder.spools[r.partition].bytes] for r in planned]
        yield pa.RecordBatch.from_pydict(
            {
                "task": [task],
                "slot": [slot],
                "object_id": [object_id],
                "size_bytes": [size],
                "stream_object": [len(planned) == 1],
                "ranges": [json.dumps(ranges, separators=(",", ":"))],
                "error": [None],
            },
            schema=WRITE_SCHEMA,
        )
    finally:
        encoder.close()


def _changed_message(where: str, got: dict[int, tuple[int, int]], want: dict[int, tuple[int, int]]) -> str:
    """Why the write pass refuses a task's rows: the counts or the row digests differ from the count pass's."""
    got_counts = {p: n for p, (n, _) in sorted(got.items())}
    want_counts = {p: n for p, (n, _) in sorted(want.items())}
    if got_counts != want_counts:
        return (
            f"{where}: the write pass has {got_counts} records per partition, the count pass had "
            f"{want_counts}: the micro-batch's rows changed between the passes; nothing of it is committed"
        )
    differ = sorted(p for p in got if got[p][1] != want[p][1])
    return (
        f"{where}: the row digest of partition(s) {differ} differs from the count pass's (same record "
        "counts, other rows): the micro-batch's rows changed between the passes (a non-deterministic "
        "recompute); nothing of it is committed"
    )


@dataclass(frozen=True, slots=True)
class WriteFunction:
    """The picklable ``mapInArrow`` function of the write pass."""

    options: DirectOptions

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx is None:
            return write_partition(self.options, 0, 0, batches)
        return write_partition(self.options, ctx.partitionId(), ctx.attemptNumber(), batches)
