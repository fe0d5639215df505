"""The direct path's executor side: the count pass and the write pass, inside ``mapInArrow``.

Both passes run over the same persisted micro-batch (the sink's normalized rows). Neither sends a
payload byte to the driver: the count pass returns one row per (Spark partition, topic partition)
(:data:`COUNT_DDL`), the write pass one row per task attempt that wrote an object (:data:`WRITE_DDL`:
its id, size and per-partition ranges as a small JSON list).

The write pass encodes a task's rows into Kafka RecordBatch v2 payloads exactly as the driver path
does (:class:`~spark_sink.encode._Encoder`: same cut at ``batch_bytes_target``), but with absolute base
offsets: partition ``p`` of task ``t`` starts at the plan's base ``(t, p)``. Payloads are spooled per
partition (memory up to a bound, then a local temporary file) because an object holds its streams in
stream id order while a task's rows come in any order; then the task recounts (a difference from the
count pass fails the micro-batch: the rows changed, e.g. a lost cache block recomputed from a source
that does not replay the same rows) and uploads ONE object create-only under the id of its attempt's
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
from typing import IO

import pyarrow as pa
import pyarrow.compute as pc

from s3stream.direct.writer import write_object
from s3stream.errors import ConflictError
from s3stream.objectformat.writer import RecordFields
from spark_sink.direct_protocol import SlotTable, attempt_slots
from spark_sink.encode import PARTITION_COLUMN, EncodeOptions, _Encoder, _Pending, check_rows
from spark_sink.kafka_codec import encode_batch

COUNT_SCHEMA = pa.schema(
    [
        pa.field("task", pa.int32(), nullable=False),  # Spark partition
        pa.field("partition", pa.int32(), nullable=False),  # topic partition (-1 on an error row)
        pa.field("records", pa.int64(), nullable=False),
        pa.field("payload_bytes", pa.int64(), nullable=False),  # key + value bytes
        pa.field("error", pa.string(), nullable=True),
    ]
)
COUNT_DDL = "task int, partition int, records bigint, payload_bytes bigint, error string"
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
    bases: Mapping[tuple[int, int], int]
    counts: Mapping[tuple[int, int], int]
    slots: SlotTable
    task_observer: TaskObserver = field(default=no_task_observer)


def _count_error(task: int, message: str) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {"task": [task], "partition": [-1], "records": [0], "payload_bytes": [0], "error": [message]},
        schema=COUNT_SCHEMA,
    )


def count_partition(
    options: EncodeOptions, task: int, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """The count pass of one task: rows and key+value bytes per topic partition (or one error row)."""
    records: dict[int, int] = {}
    sizes: dict[int, int] = {}
    for rows in batches:
        message = check_rows(rows, options)
        if message is not None:
            yield _count_error(task, f"{message} (Spark partition {task})")
            return
        if not len(rows):
            continue
        part = rows.column(PARTITION_COLUMN)
        size = pc.add(
            pc.binary_length(rows.column("value")), pc.fill_null(pc.binary_length(rows.column("key")), 0)
        )
        grouped = (
            pa.table({"p": part, "s": pc.cast(size, pa.int64())})
            .group_by("p")
            .aggregate([("s", "count"), ("s", "sum")])
        )
        for p, n, s in zip(
            grouped.column("p").to_pylist(),
            grouped.column("s_count").to_pylist(),
            grouped.column("s_sum").to_pylist(),
            strict=True,
        ):
            records[p] = records.get(p, 0) + n
            sizes[p] = sizes.get(p, 0) + s
    if records:
        keys = sorted(records)
        yield pa.RecordBatch.from_pydict(
            {
                "task": [task] * len(keys),
                "partition": keys,
                "records": [records[p] for p in keys],
                "payload_bytes": [sizes[p] for p in keys],
                "error": [None] * len(keys),
            },
            schema=COUNT_SCHEMA,
        )


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

    def __init__(self, options: DirectOptions, task: int) -> None:
        super().__init__(options.encode, task)
        self.direct = options
        partitions = [p for (t, p) in options.counts if t == task]
        self.next_offset = {p: options.bases[(task, p)] for p in partitions}
        memory = SPOOL_MEMORY_BYTES_MAX // max(1, len(partitions))
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
    """The write pass of one task attempt: encode, recount, upload one object, describe it."""
    where = f"micro-batch {options.encode.batch_id}, Spark partition {task}"
    planned = sorted(p for (t, p) in options.counts if t == task)
    encoder = _DirectEncoder(options, task)
    try:
        for rows in batches:
            message = check_rows(rows, options.encode)
            if message is not None:
                yield _write_error(task, f"{message} (Spark partition {task})")
                return
            part = rows.column(PARTITION_COLUMN)
            for target in sorted(pc.unique(part).to_pylist()):
                encoder.add(
                    target,
                    rows if options.encode.partition_count == 1 else rows.filter(pc.equal(part, target)),
                )
        encoder.finish()
        got = {p: s.records for p, s in encoder.spools.items()}
        want = {p: options.counts[(task, p)] for p in planned}
        if encoder.unplanned is not None or got != want:
            yield _write_error(
                task,
                f"{where}: the write pass has {got} records per partition, the count pass had {want}: the "
                "micro-batch's rows changed between the passes; nothing of it is committed",
            )
            return
        if not planned:
            return
        options.task_observer("after_encode", options.encode.batch_id, task, task_attempt)
        order = sorted(planned, key=lambda p: options.stream_ids[p])

        def records() -> Iterator[RecordFields]:
            for p in order:
                yield from encoder.spools[p].read(options.stream_ids[p], options.stream_epochs[p])

        written = None
        for slot in attempt_slots(task_attempt, options.slots.slots_per_task):
            object_id = options.slots.object_id(task, slot)
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
                f"{options.slots.slots_per_task}; the micro-batch fails and its replay prepares new ids",
            )
            return
        slot, object_id, size = written
        options.task_observer("after_upload", options.encode.batch_id, task, task_attempt)
        ranges = [
            [p, options.bases[(task, p)], options.bases[(task, p)] + want[p], encoder.spools[p].bytes]
            for p in planned
        ]
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


@dataclass(frozen=True, slots=True)
class CountFunction:
    """The picklable ``mapInArrow`` function of the count pass."""

    options: EncodeOptions

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        return count_partition(self.options, ctx.partitionId() if ctx is not None else 0, batches)


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
