"""Executor side of the ``s3stream`` Spark source: fetch planned ranges, decode Kafka batches to Arrow.

Each task gets :class:`~spark_sink.source_plan.ReadRange` values planned on the driver, fetches
them through its process's shared reader (ranged GETs of the objects holding them) and yields Arrow
record batches in the Kafka source's schema (:data:`SOURCE_DDL`).

Invariants: a task yields exactly the records with offsets in its ranges, in offset order, each once
(payload batches overlapping a range's edges are cut to it); a gap or overlap in what the reader
returns, or a payload whose records are not exactly the offsets the stream gives it, is a
:class:`~s3stream.errors.CorruptionError`, never silently skipped.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa

from s3stream.errors import CorruptionError
from s3stream.ids import StreamId
from spark_sink.kafka_arrow import HEADER_TYPE, RECORDS_SCHEMA, decode_batch_arrow
from spark_sink.source_plan import ReadRange
from spark_sink.source_state import ReaderKey, shared_reader

SOURCE_DDL = (
    "key binary, value binary, topic string, partition int, offset bigint, timestamp timestamp, "
    "timestampType int, headers array<struct<key: string, value: binary>>"
)
"""The Kafka source's columns (with ``includeHeaders``)."""
FETCH_MAX_BYTES = 8 << 20
"""Bytes asked per fetch of a task."""
ROWS_PER_ARROW_BATCH = 8192
"""Rows per yielded Arrow record batch (at least one Kafka batch's rows)."""

SOURCE_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("timestampType", pa.int32()),
        pa.field("headers", HEADER_TYPE),
    ]
)


ARROW_BATCH_BYTES_MAX = 64 << 20
"""A yielded Arrow batch is cut once its decoded pieces pass this many bytes (binary offsets are int32)."""


class _Pieces:
    """Decoded records of one partition not yet yielded, as pieces of :data:`RECORDS_SCHEMA`."""

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self.pieces: list[pa.RecordBatch] = []
        self.rows = 0
        self.size_bytes = 0

    def add(self, rb: pa.RecordBatch) -> None:
        if rb.num_rows:
            self.pieces.append(rb)
            self.rows += rb.num_rows
            self.size_bytes += rb.nbytes

    def full(self) -> bool:
        return self.rows >= ROWS_PER_ARROW_BATCH or self.size_bytes >= ARROW_BATCH_BYTES_MAX

    def take(self) -> pa.RecordBatch:
        """The pieces as one batch of :data:`SOURCE_SCHEMA` (one copy of their buffers); empties this."""
        records = pa.Table.from_batches(self.pieces, schema=RECORDS_SCHEMA).combine_chunks()
        n = records.num_rows
        topics = pa.array([self.topic], pa.string()).take(pa.array(np.zeros(n, dtype=np.int32)))
        out = pa.RecordBatch.from_arrays(
            [
                records.column("key").chunk(0),
                records.column("value").chunk(0),
                topics,
                pa.array(np.full(n, self.partition, dtype=np.int32)),
                records.column("offset").chunk(0),
                records.column("timestamp").chunk(0),
                records.column("timestamp_type").chunk(0),
                records.column("headers").chunk(0),
            ],
            schema=SOURCE_SCHEMA,
        )
        self.pieces = []
        self.rows = 0
        self.size_bytes = 0
        return out


def _check_offsets(rb: pa.RecordBatch, stream_id: int, base: int, end: int, start: int, stop: int) -> None:
    """CorruptionError unless the decoded rows of batch ``[base, end)`` hold exactly the offsets
    ``start, start + 1, ..., stop - 1`` (a payload whose records disagree with the offsets the
    stream gives it would otherwise shift or drop rows silently)."""
    offsets = rb.column("offset").to_numpy()
    if len(offsets) == stop - start and np.array_equal(offsets, np.arange(start, stop, dtype=np.int64)):
        return
    found = f"{len(offsets)} rows" + (f" at [{offsets[0]}, {offsets[-1]}]" if len(offsets) else "")
    raise CorruptionError(
        f"stream {stream_id}: batch [{base}, {end}) decoded to offsets {found}, expected [{start}, {stop})",
        source=f"stream {stream_id} offset {base}",
    )


def read_ranges(key: ReaderKey, topic: str, ranges: Sequence[ReadRange]) -> Iterator[pa.RecordBatch]:
    """The records of ``ranges`` as Arrow batches of :data:`SOURCE_SCHEMA`."""
    reader = shared_reader(key)
    for r in ranges:
        pieces = _Pieces(topic, r.partition)
        pos = r.start_offset
        while pos < r.end_offset:
            fetched = reader.fetch(StreamId(r.stream_id), pos, r.end_offset, FETCH_MAX_BYTES)
            if not fetched:
                raise CorruptionError(
                    f"stream {r.stream_id}: nothing returned at offset {pos} of [{r.start_offset}, {r.end_offset})",
                    source=f"stream {r.stream_id}",
                )
            for b in fetched:
                if b.base_offset > pos or b.end_offset <= pos:
                    raise CorruptionError(
                        f"stream {r.stream_id}: batch [{b.base_offset}, {b.end_offset}) does not continue at {pos}",
                        source=f"stream {r.stream_id}",
                    )
                rb = decode_batch_arrow(
                    b.payload,
                    source=f"stream {r.stream_id} offset {b.base_offset}",
                    base_offset=b.base_offset,
                    start_offset=pos,
                    end_offset=r.end_offset,
                )
                _check_offsets(
                    rb, r.stream_id, b.base_offset, b.end_offset, pos, min(b.end_offset, r.end_offset)
                )
                pieces.add(rb)
                pos = b.end_offset
                if pieces.full():
                    yield pieces.take()
                if pos >= r.end_offset:
                    break
        if pieces.rows:
            yield pieces.take()
