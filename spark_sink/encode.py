"""Executor-side encoding: Arrow record batches of rows in, Kafka RecordBatch payloads out.

Runs inside ``DataFrame.mapInArrow`` on the executors. The input has the normalized columns of
:data:`INPUT_COLUMNS` (the sink's ``select`` produces them); the output is one row per encoded Kafka
RecordBatch (:data:`OUTPUT_SCHEMA`), grouped per target partition (stream) and cut at a byte target.

The output depends only on the rows of the Spark partition and their order, never on Arrow batch
boundaries or the clock: Spark replays a micro-batch with the same source range, and the sink's
exactly-once protocol relies on the replay producing the same payload rows in the same order.
Bad rows do not raise on the executor (a stack trace per task); they produce one error row that the
driver turns into an :class:`~s3stream.errors.InvalidArgumentError` naming the column and the batch.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import BinaryIO

import crc32c
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_sink.kafka_codec import BATCH_HEADER_SIZE, Header, encode_batch

PARTITION_COLUMN = "__s3s_partition"
TIMESTAMP_MS_COLUMN = "__s3s_timestamp_ms"
INPUT_COLUMNS = (PARTITION_COLUMN, "key", "value", "headers", TIMESTAMP_MS_COLUMN)
"""``headers`` may be absent (no headers)."""

RECORD_OVERHEAD_BYTES = 24
"""Per-record bytes counted towards the batch target besides key, value and headers (varints)."""

OUTPUT_SCHEMA = pa.schema(
    [
        pa.field("partition", pa.int32(), nullable=False),  # target partition (index of the stream)
        pa.field("task_partition", pa.int32(), nullable=False),  # Spark partition that encoded it
        pa.field("seq", pa.int32(), nullable=False),  # order of the payload within the task
        pa.field("record_count", pa.int32(), nullable=False),
        pa.field("content_crc", pa.int64(), nullable=False),  # CRC-32C of the records area
        pa.field("size_bytes", pa.int64(), nullable=False),  # bytes of the Kafka batch
        pa.field("payload", pa.binary(), nullable=True),  # one Kafka RecordBatch v2 (null when spilled)
        pa.field("spill_file", pa.string(), nullable=True),  # or: the file holding it ...
        pa.field("spill_offset", pa.int64(), nullable=False),  # ... at this byte offset
        pa.field("error", pa.string(), nullable=True),  # set on the single error row
    ]
)
OUTPUT_DDL = (
    "partition int, task_partition int, seq int, record_count int, content_crc bigint, size_bytes bigint, "
    "payload binary, spill_file string, spill_offset bigint, error string"
)


@dataclass(frozen=True, slots=True)
class EncodeOptions:
    """What the executors need to know (pickled into the task closure)."""

    batch_id: int
    partition_count: int
    batch_bytes_target: int
    record_max_bytes: int
    partition_column: str
    """The user's column name, for error messages."""
    spill_dir: str | None = None
    """Local mode: write payloads to files here (the driver maps them) instead of returning them."""


@dataclass(slots=True)
class _Pending:
    keys: list[bytes | None] = field(default_factory=list)
    values: list[bytes | None] = field(default_factory=list)
    timestamps_ms: list[int] = field(default_factory=list)
    headers: list[list[Header] | None] | None = None
    size_bytes: int = 0


class _Encoder:
    """Per-task state: one pending batch per target partition."""

    def __init__(self, options: EncodeOptions, task_partition: int, attempt: int = 0) -> None:
        self.options = options
        self.task_partition = task_partition
        self.pending: dict[int, _Pending] = {}
        self.seq = 0
        self.out: dict[str, list[object]] = {name: [] for name in OUTPUT_SCHEMA.names}
        self.spill: BinaryIO | None = None
        self.spill_path: str | None = None
        self.spill_offset = 0
        if options.spill_dir is not None:
            name = f"b{options.batch_id}-p{task_partition}-a{attempt}-{uuid.uuid4().hex[:12]}.kafka"
            self.spill_path = os.path.join(options.spill_dir, name)

    def close(self) -> None:
        if self.spill is not None:
            self.spill.close()
            self.spill = None

    def _emit(self, partition: int, p: _Pending) -> None:
        payload = encode_batch(p.keys, p.values, p.timestamps_ms, p.headers)
        # The records area (after the batch header) is the same on a replay: timestamps are either
        # the rows' own or one constant per call (all deltas 0); the header's first/max timestamp
        # and CRC are not.
        content = crc32c.crc32c(memoryview(payload)[BATCH_HEADER_SIZE:])
        out = self.out
        out["partition"].append(partition)
        out["task_partition"].append(self.task_partition)
        out["seq"].append(self.seq)
        out["record_count"].append(len(p.values))
        out["content_crc"].append(content)
        out["size_bytes"].append(len(payload))
        if self.spill_path is None:
            out["payload"].append(payload)
            out["spill_file"].append(None)
            out["spill_offset"].append(0)
        else:
            if self.spill is None:
                self.spill = open(self.spill_path, "wb")  # noqa: SIM115 - closed by close()
            self.spill.write(payload)
            out["payload"].append(None)
            out["spill_file"].append(self.spill_path)
            out["spill_offset"].append(self.spill_offset)
            self.spill_offset += len(payload)
        out["error"].append(None)
        self.seq += 1

    def take_output(self) -> pa.RecordBatch | None:
        if not self.out["seq"]:
            return None
        if self.spill is not None:
            self.spill.flush()  # the driver maps the file once the task is done
        batch = pa.RecordBatch.from_pydict(self.out, schema=OUTPUT_SCHEMA)
        self.out = {name: [] for name in OUTPUT_SCHEMA.names}
        return batch

    def add(self, partition: int, rows: pa.RecordBatch) -> None:
        """Add the rows of one target partition (in order), emitting every full batch."""
        keys = rows.column("key").to_pylist()
        values = rows.column("value").to_pylist()
        timestamps = rows.column(TIMESTAMP_MS_COLUMN).to_pylist()
        headers: list[list[Header] | None] | None = None
        sizes = pc.add(
            pc.fill_null(pc.binary_length(rows.column("value")), 0),
            pc.fill_null(pc.binary_length(rows.column("key")), 0),
        )
        if "headers" in rows.schema.names:
            raw = rows.column("headers").to_pylist()
            headers = [None if h is None else [(e["key"], e["value"]) for e in h] for h in raw]
        sizes_np = sizes.to_numpy(zero_copy_only=False).astype(np.int64) + RECORD_OVERHEAD_BYTES
        if headers is not None:
            sizes_np += np.fromiter(
                (0 if h is None else sum(len(k) + (len(v) if v else 0) + 4 for k, v in h) for h in headers),
                dtype=np.int64,
                count=len(headers),
            )
        cum = np.cumsum(sizes_np)
        n = len(values)
        target = self.options.batch_bytes_target
        p = self.pending.get(partition)
        start = 0
        while start < n:
            if p is None:
                p = _Pending(headers=None if headers is None else [])
                self.pending[partition] = p
            base = int(cum[start - 1]) if start else 0
            # first row j whose inclusion reaches the target: cum[j] - base >= target - p.size_bytes
            j = int(np.searchsorted(cum, base + target - p.size_bytes, side="left"))
            stop = min(j + 1, n)
            p.keys.extend(keys[start:stop])
            p.values.extend(values[start:stop])
            p.timestamps_ms.extend(timestamps[start:stop])
            if headers is not None and p.headers is not None:
                p.headers.extend(headers[start:stop])
            p.size_bytes += int(cum[stop - 1]) - base
            if j < n:
                self._emit(partition, p)
                p = None
                del self.pending[partition]
            start = stop

    def finish(self) -> None:
        for partition in sorted(self.pending):
            self._emit(partition, self.pending[partition])
        self.pending.clear()


def _error_batch(message: str, task_partition: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {
            "partition": [-1],
            "task_partition": [task_partition],
            "seq": [-1],
            "record_count": [0],
            "content_crc": [0],
            "size_bytes": [0],
            "payload": [None],
            "spill_file": [None],
            "spill_offset": [0],
            "error": [message],
        },
        schema=OUTPUT_SCHEMA,
    )


def check_rows(rows: pa.RecordBatch, options: EncodeOptions) -> str | None:
    """A message naming the first bad column of ``rows`` and the batch, or None if all rows are good."""
    where = f"micro-batch {options.batch_id}"
    value = rows.column("value")
    if value.null_count:
        return f"{where}: column 'value' is null in {value.null_count} row(s); the sink needs a value"
    part = rows.column(PARTITION_COLUMN)
    if part.null_count:
        return f"{where}: column {options.partition_column!r} is null in {part.null_count} row(s)"
    if len(rows):
        lo, hi = pc.min_max(part).values()
        if lo.as_py() < 0 or hi.as_py() >= options.partition_count:
            bad = lo.as_py() if lo.as_py() < 0 else hi.as_py()
            return (
                f"{where}: column {options.partition_column!r} holds {bad}, outside the "
                f"{options.partition_count} partitions [0, {options.partition_count})"
            )
    ts = rows.column(TIMESTAMP_MS_COLUMN)
    if ts.null_count:
        return f"{where}: column 'timestamp' is null in {ts.null_count} row(s)"
    for name in ("value", "key"):
        lengths = pc.binary_length(rows.column(name))
        longest = pc.max(lengths).as_py()
        if longest is not None and longest > options.record_max_bytes:
            return (
                f"{where}: column {name!r} holds a value of {longest} bytes, above the record limit "
                f"of {options.record_max_bytes} bytes"
            )
    return None


def encode_partition(
    options: EncodeOptions, task_partition: int, batches: Iterator[pa.RecordBatch], attempt: int = 0
) -> Iterator[pa.RecordBatch]:
    """The body of the ``mapInArrow`` function for one task (Spark partition)."""
    encoder = _Encoder(options, task_partition, attempt)
    try:
        yield from _encode_rows(encoder, options, task_partition, batches)
    finally:
        encoder.close()


def _encode_rows(
    encoder: _Encoder, options: EncodeOptions, task_partition: int, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    for rows in batches:
        message = check_rows(rows, options)
        if message is not None:
            yield _error_batch(f"{message} (Spark partition {task_partition})", task_partition)
            return
        part = rows.column(PARTITION_COLUMN)
        if options.partition_count == 1:
            if len(rows):
                encoder.add(0, rows)
        else:
            for target in sorted(pc.unique(part).to_pylist()):
                encoder.add(target, rows.filter(pc.equal(part, target)))
        out = encoder.take_output()
        if out is not None:
            yield out
    encoder.finish()
    out = encoder.take_output()
    if out is not None:
        yield out


def map_in_arrow(options: EncodeOptions) -> _MapFunction:
    """The picklable function to give ``mapInArrow``."""
    return _MapFunction(options)


@dataclass(frozen=True, slots=True)
class _MapFunction:
    options: EncodeOptions

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        task_partition = ctx.partitionId() if ctx is not None else 0
        attempt = ctx.attemptNumber() if ctx is not None else 0
        return encode_partition(self.options, task_partition, batches, attempt)
