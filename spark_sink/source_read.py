"""Executor side of the ``s3stream`` Spark source: fetch planned ranges, decode Kafka batches to Arrow.

Each task gets :class:`~spark_sink.source_plan.ReadRange` values planned on the driver, fetches
them through its process's shared reader (ranged GETs of the objects holding them) and yields Arrow
record batches in the Kafka source's schema (:data:`SOURCE_DDL`).

Invariants: a task yields exactly the records with offsets in its ranges, in offset order, each once
(payload batches overlapping a range's edges are cut to it); a gap or overlap in what the reader
returns is a :class:`~s3stream.errors.CorruptionError`, never silently skipped.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa

from s3stream.errors import CorruptionError
from s3stream.ids import StreamId
from spark_sink.kafka_codec import decode_batch
from spark_sink.source_plan import ReadRange
from spark_sink.source_state import ReaderKey, shared_reader

SOURCE_DDL = (
    "key binary, value binary, topic string, partition int, offset bigint, timestamp timestamp, "
    "timestampType int, headers array<struct<key: string, value: binary>>"
)
"""The Kafka source's columns (with ``includeHeaders``)."""
TIMESTAMP_TYPE_CREATE_TIME = 0
"""Kafka's ``timestampType`` of a batch whose attributes say create time (all the sink writes)."""
FETCH_MAX_BYTES = 8 << 20
"""Bytes asked per fetch of a task."""
ROWS_PER_ARROW_BATCH = 8192
"""Rows per yielded Arrow record batch (at least one Kafka batch's rows)."""

_HEADER_TYPE = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
SOURCE_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("timestampType", pa.int32()),
        pa.field("headers", _HEADER_TYPE),
    ]
)


class _Columns:
    """Columns of the rows decoded so far."""

    def __init__(self) -> None:
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.offsets: list[int] = []
        self.timestamps_us: list[int] = []
        self.headers: list[list[dict[str, object]]] = []

    def to_batch(self, topic: str, partition: int) -> pa.RecordBatch:
        n = len(self.offsets)
        return pa.RecordBatch.from_arrays(
            [
                pa.array(self.keys, pa.binary()),
                pa.array(self.values, pa.binary()),
                pa.array([topic] * n, pa.string()),
                pa.array([partition] * n, pa.int32()),
                pa.array(self.offsets, pa.int64()),
                pa.array(self.timestamps_us, pa.timestamp("us", tz="UTC")),
                pa.array([TIMESTAMP_TYPE_CREATE_TIME] * n, pa.int32()),
                pa.array(self.headers, _HEADER_TYPE),
            ],
            schema=SOURCE_SCHEMA,
        )


def read_ranges(key: ReaderKey, topic: str, ranges: Sequence[ReadRange]) -> Iterator[pa.RecordBatch]:
    """The records of ``ranges`` as Arrow batches of :data:`SOURCE_SCHEMA`."""
    reader = shared_reader(key)
    for r in ranges:
        cols = _Columns()
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
                _decode_into(cols, b.payload, r, b.base_offset, pos)
                pos = b.end_offset
                if len(cols.offsets) >= ROWS_PER_ARROW_BATCH:
                    yield cols.to_batch(topic, r.partition)
                    cols = _Columns()
                if pos >= r.end_offset:
                    break
        if cols.offsets:
            yield cols.to_batch(topic, r.partition)


def _decode_into(cols: _Columns, payload: bytes, r: ReadRange, base_offset: int, pos: int) -> None:
    """Append the records of one payload that lie in ``[pos, r.end_offset)``."""
    source = f"stream {r.stream_id} offset {base_offset}"
    decoded, end = decode_batch(payload, source=source, base_offset=base_offset)
    if end != len(payload):
        raise CorruptionError(
            f"{len(payload) - end} bytes after the Kafka batch", source=source, position=end
        )
    offsets = decoded.offsets
    a, b = 0, len(offsets)
    if offsets and (offsets[0] < pos or offsets[-1] >= r.end_offset):
        keep = [j for j, o in enumerate(offsets) if pos <= o < r.end_offset]
        a, b = (keep[0], keep[-1] + 1) if keep else (0, 0)
    cols.offsets.extend(offsets[a:b])
    cols.keys.extend(decoded.keys[a:b])
    cols.values.extend(decoded.values[a:b])
    cols.timestamps_us.extend(t * 1000 for t in decoded.timestamps_ms[a:b])
    cols.headers.extend([{"key": k, "value": v} for k, v in h] for h in decoded.headers[a:b])
