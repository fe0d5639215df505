"""Kafka RecordBatch v2 decoded in bulk into Arrow columns: one batch's records, no per-record objects.

The layout is :mod:`spark_sink.kafka_codec`'s (``docs/spark-sink.md`` section "Payload format").
:func:`decode_batch_arrow` verifies the header with :func:`~spark_sink.kafka_codec.read_batch_header`
(magic, length, CRC-32C, no compression, no control batch), walks the records' length prefixes
once (the one per-record step that is sequential), then parses every other field of all records at
once with numpy and gathers keys and values straight into Arrow buffers.

Invariants:

* The result equals :func:`~spark_sink.kafka_codec.decode_batch`'s on the same bytes, row for row
  (offsets, timestamps, keys with nulls, values with nulls, headers, the batch's timestamp type). A
  batch whose records carry headers, or whose records do not pass the bulk checks, is decoded by
  ``decode_batch`` itself, so bad bytes raise the same :class:`~s3stream.errors.CorruptionError` and nothing else.
* Only records with offsets in ``[start_offset, end_offset)`` are returned (a payload overlapping a
  range's edges is cut to it), in the batch's order.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from spark_sink.kafka_codec import TIMESTAMP_TYPE_MASK, decode_batch, read_batch_header

HEADER_TYPE = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
RECORDS_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("headers", HEADER_TYPE),
        pa.field("timestamp_type", pa.int32()),
    ]
)
"""The columns :func:`decode_batch_arrow` returns (the record's own fields, and its batch's
timestamp type: :data:`TIMESTAMP_TYPE_CREATE_TIME` or :data:`TIMESTAMP_TYPE_LOG_APPEND_TIME`)."""
TIMESTAMP_TYPE_CREATE_TIME = 0
"""Kafka's ``timestampType`` of a record whose batch's attributes say create time."""
TIMESTAMP_TYPE_LOG_APPEND_TIME = 1
"""Kafka's ``timestampType`` of a record whose batch's attributes say log append time."""
VARINT_BYTES_MAX = 10
"""A 64-bit zigzag varint takes at most 10 bytes."""
RECORD_BODY_MIN_BYTES = 6
"""The fewest bytes a record has after its length prefix: attributes (1), then timestamp delta,
offset delta, key length, value length and header count (a varint of at least 1 byte each)."""
RECORD_MIN_BYTES = 1 + RECORD_BODY_MIN_BYTES
"""The fewest bytes a record takes in a batch, its length prefix included."""

INT64_MAX = (1 << 63) - 1
TIMESTAMP_MS_MAX = INT64_MAX // 1000
"""The largest timestamp (ms, either sign) whose microseconds fit the int64 timestamp column."""

_EMPTY_HEADERS = pa.array([], type=HEADER_TYPE.value_type)


def decode_batch_arrow(
    payload: bytes | bytearray | memoryview,
    *,
    source: str,
    base_offset: int,
    start_offset: int,
    end_offset: int,
) -> pa.RecordBatch:
    """The records of the one batch filling ``payload`` with offsets in ``[start_offset, end_offset)``,
    as a record batch of :data:`RECORDS_SCHEMA`; ``base_offset`` overrides the stored one.

    CorruptionError for bad bytes, including bytes after the batch."""
    from s3stream.errors import CorruptionError

    view = memoryview(payload) if not isinstance(payload, memoryview) else payload
    header = read_batch_header(view, 0, source=source, base_offset=base_offset)
    if header.end != len(view):
        raise CorruptionError(
            f"{len(view) - header.end} bytes after the Kafka batch", source=source, position=header.end
        )
    body = bytes(view[header.records_start : header.end])
    bulk = _bulk_records(body, header.record_count)
    if bulk is None:  # headers, or bytes the bulk checks refuse: the per-record decoder decides
        rb = _slow_records(view, source=source, base_offset=base_offset)
    else:
        ts_delta, offset_delta, key_at, key_len, value_at, value_len = bulk
        data = pa.py_buffer(body)
        n = header.record_count
        if n:  # checked before the int64 arithmetic, which would wrap silently
            if header.log_append_time:
                ts_lo = ts_hi = header.max_timestamp_ms
            else:
                ts_lo = header.first_timestamp_ms + int(ts_delta.min())
                ts_hi = header.first_timestamp_ms + int(ts_delta.max())
            _check_ranges(
                header.base_offset + int(offset_delta.min()),
                header.base_offset + int(offset_delta.max()),
                ts_lo,
                ts_hi,
                source=source,
            )
        offsets = offset_delta + header.base_offset
        if header.log_append_time:
            ts_ms = np.full(n, header.max_timestamp_ms, dtype=np.int64)
        else:
            ts_ms = ts_delta + header.first_timestamp_ms
        rb = pa.RecordBatch.from_arrays(
            [
                _binary(data, key_at, key_len),
                _binary(data, value_at, value_len),
                pa.array(offsets, pa.int64()),
                pa.array(ts_ms * 1000, pa.timestamp("us", tz="UTC")),
                pa.ListArray.from_arrays(pa.array(np.zeros(n + 1, np.int32)), _EMPTY_HEADERS),
                _timestamp_types(n, header.log_append_time),
            ],
            schema=RECORDS_SCHEMA,
        )
    return _cut(rb, start_offset, end_offset)


def _cut(rb: pa.RecordBatch, start_offset: int, end_offset: int) -> pa.RecordBatch:
    """The rows whose offsets lie in ``[start_offset, end_offset)`` (one contiguous slice, as the
    offsets of a batch increase)."""
    if rb.num_rows == 0:
        return rb
    offsets = rb.column(2).to_numpy()
    if offsets[0] >= start_offset and offsets[-1] < end_offset:
        return rb
    keep = np.flatnonzero((offsets >= start_offset) & (offsets < end_offset))
    if keep.size == 0:
        return rb.slice(0, 0)
    return rb.slice(int(keep[0]), int(keep[-1]) - int(keep[0]) + 1)


def _check_ranges(offset_lo: int, offset_hi: int, ts_lo: int, ts_hi: int, *, source: str) -> None:
    """CorruptionError unless the records' offsets fit int64 and their timestamps (ms) fit the
    microsecond column; both decode paths check the same bounds in the same order, so they fail alike."""
    from s3stream.errors import CorruptionError

    for what, lo, hi, least, most in (
        ("offset", offset_lo, offset_hi, -INT64_MAX - 1, INT64_MAX),
        ("timestamp (ms)", ts_lo, ts_hi, -TIMESTAMP_MS_MAX, TIMESTAMP_MS_MAX),
    ):
        bad = lo if lo < least else hi if hi > most else None
        if bad is not None:
            raise CorruptionError(
                f"Kafka record {what} {bad} outside [{least}, {most}]", source=source, position=0
            )


def _timestamp_types(n: int, log_append_time: bool) -> pa.Array:
    kind = TIMESTAMP_TYPE_LOG_APPEND_TIME if log_append_time else TIMESTAMP_TYPE_CREATE_TIME
    return pa.array(np.full(n, kind, dtype=np.int32))


def _slow_records(view: memoryview, *, source: str, base_offset: int) -> pa.RecordBatch:
    decoded, _ = decode_batch(view, source=source, base_offset=base_offset)
    if decoded.record_count:
        _check_ranges(
            min(decoded.offsets),
            max(decoded.offsets),
            min(decoded.timestamps_ms),
            max(decoded.timestamps_ms),
            source=source,
        )
    return pa.RecordBatch.from_arrays(
        [
            pa.array(decoded.keys, pa.binary()),
            pa.array(decoded.values, pa.binary()),
            pa.array(decoded.offsets, pa.int64()),
            pa.array([t * 1000 for t in decoded.timestamps_ms], pa.timestamp("us", tz="UTC")),
            pa.array([[{"key": k, "value": v} for k, v in h] for h in decoded.headers], HEADER_TYPE),
            _timestamp_types(decoded.record_count, bool(decoded.attributes & TIMESTAMP_TYPE_MASK)),
        ],
        schema=RECORDS_SCHEMA,
    )


_Bulk = tuple[Any, Any, Any, Any, Any, Any]


def _bulk_records(body: bytes, count: int) -> _Bulk | None:
    """Every record's fields at once, or None when a record has headers or fails a check (the
    caller then decodes per record, which names the fault)."""
    bounds = _record_bounds(body, count)
    if bounds is None:
        return None
    starts, ends = bounds
    buf = np.zeros(len(body) + VARINT_BYTES_MAX + 1, dtype=np.uint8)
    buf[: len(body)] = np.frombuffer(body, dtype=np.uint8)
    pos = starts + 1  # attributes: unused
    fields: list[Any] = []
    for _ in range(2):  # timestamp delta, offset delta
        parsed = _varints_at(buf, pos)
        if parsed is None:
            return None
        value, pos = parsed
        fields.append(value)
    spans: list[tuple[Any, Any]] = []
    for _ in range(2):  # key, value: a length (-1: null), then the bytes
        parsed = _varints_at(buf, pos)
        if parsed is None:
            return None
        length, pos = parsed
        if length.size and int(length.min()) < -1:
            return None
        spans.append((pos, length))
        pos = pos + np.maximum(length, 0)
    parsed = _varints_at(buf, pos)
    if parsed is None:
        return None
    header_count, pos = parsed
    if np.any(header_count != 0) or not np.array_equal(pos, ends):
        return None
    (key_at, key_len), (value_at, value_len) = spans
    return fields[0], fields[1], key_at, key_len, value_at, value_len


def _record_bounds(body: bytes, count: int) -> tuple[Any, Any] | None:
    """Start and end of each record's bytes after its length prefix; None unless ``count`` records
    of at least :data:`RECORD_BODY_MIN_BYTES` bytes fill ``body`` exactly.

    A count that cannot fit ``body`` or a record length below the minimum gives None at once (the
    per-record decoder then names the fault), so a damaged count or length never costs a loop step
    per claimed record.

    A Python loop follows the length prefixes; once three records in a row had the same size, the
    records after them are checked in one numpy step (:func:`_same_size_run`) and skipped, so rows
    of one size (or runs of them) cost no loop step each."""
    size = len(body)
    if count > size // RECORD_MIN_BYTES:
        return None
    raw = np.frombuffer(body, dtype=np.uint8)
    starts: list[int] = []
    lengths: list[int] = []
    add_start = starts.append
    add_length = lengths.append
    runs: list[tuple[Any, Any]] = []
    pos = 0
    done = 0
    last_stride = -1
    repeats = 0
    try:
        while done < count:
            record_at = pos
            z = body[pos]
            if z < 0x80:
                pos += 1
            else:
                b2 = body[pos + 1]
                if b2 < 0x80:
                    z = (z & 0x7F) | (b2 << 7)
                    pos += 2
                else:
                    z, pos = _long_zigzag(body, pos)
            length = (z >> 1) ^ -(z & 1)
            if length < RECORD_BODY_MIN_BYTES:  # also keeps pos moving forward
                return None
            add_start(pos)
            add_length(length)
            prefix_bytes = pos - record_at
            pos += length
            done += 1
            stride = pos - record_at
            repeats = repeats + 1 if stride == last_stride else 0
            last_stride = stride
            if repeats >= 2 and done < count:
                run = _same_size_run(raw, record_at, pos, stride, prefix_bytes, count - done)
                if run:
                    runs.append((np.array(starts, dtype=np.int64), np.array(lengths, dtype=np.int64)))
                    starts.clear()
                    lengths.clear()
                    first = pos + prefix_bytes
                    runs.append(
                        (
                            np.arange(first, first + run * stride, stride, dtype=np.int64),
                            np.full(run, length, dtype=np.int64),
                        )
                    )
                    pos += run * stride
                    done += run
                    repeats = 0
    except IndexError:  # a truncated or overlong varint: the per-record decoder names it
        return None
    runs.append((np.array(starts, dtype=np.int64), np.array(lengths, dtype=np.int64)))
    start_at = np.concatenate([r[0] for r in runs])
    length_of = np.concatenate([r[1] for r in runs])
    if pos != size:
        return None
    return start_at, start_at + length_of


def _same_size_run(raw: Any, reference: int, pos: int, stride: int, prefix_bytes: int, left: int) -> int:
    """How many records from ``pos`` on, each ``stride`` bytes after the previous, begin with the
    same length prefix bytes as the record at ``reference`` (so each has its length, and the next
    begins where the stride says), at most ``left`` and only records that end inside ``raw``."""
    most = min(left, (len(raw) - pos) // stride)
    if most <= 0:
        return 0
    at = pos + np.arange(most, dtype=np.int64) * stride
    same = raw[at] == raw[reference]
    for j in range(1, prefix_bytes):
        same &= raw[at + j] == raw[reference + j]
    return most if bool(same.all()) else int(np.argmin(same))


def _long_zigzag(body: bytes, pos: int) -> tuple[int, int]:
    """The raw (zigzag) varint at ``pos`` and the position after it (the loops' general case);
    IndexError past the end or past :data:`VARINT_BYTES_MAX` bytes."""
    z = 0
    for shift in range(0, 7 * VARINT_BYTES_MAX, 7):
        b = body[pos]
        pos += 1
        z |= (b & 0x7F) << shift
        if b < 0x80:
            return z & 0xFFFFFFFFFFFFFFFF, pos
    raise IndexError("varint longer than 10 bytes")


def _varints_at(buf: Any, pos: Any) -> tuple[Any, Any] | None:
    """The zigzag varints starting at each position of ``pos`` (positions within ``buf``, which has
    :data:`VARINT_BYTES_MAX` zero bytes of padding) and the positions after them; None for a varint
    longer than :data:`VARINT_BYTES_MAX` bytes."""
    if int(pos.max(initial=0)) >= len(buf) - VARINT_BYTES_MAX:
        return None
    b = buf[pos]
    z = (b & 0x7F).astype(np.uint64)
    after = pos + 1
    more = np.flatnonzero(b >= 0x80)
    shift = 7
    while more.size:
        if shift > 63:
            return None
        nb = buf[after[more]]
        z[more] |= (nb & 0x7F).astype(np.uint64) << np.uint64(shift)
        after[more] += 1
        more = more[nb >= 0x80]
        shift += 7
    value = (z >> np.uint64(1)).astype(np.int64) ^ -(z & np.uint64(1)).astype(np.int64)
    return value, after


def _binary(data: pa.Buffer, at: Any, length: Any) -> pa.Array:
    """A binary column of ``data[at[i] : at[i] + length[i]]`` (length -1: null), gathered at once.

    The spans lie in ``data`` in order without overlap, so ``at0, end0, at1, end1, ...`` is a valid
    offsets buffer over ``data`` itself: a binary array whose even elements are the wanted bytes and
    whose odd ones the gaps between them (zero copy); Arrow's ``take`` of the even elements gathers
    them into a new buffer in one pass."""
    n = len(at)
    if n == 0:
        return pa.array([], pa.binary())
    sizes = np.maximum(length, 0)
    bounds = np.empty(2 * n, dtype=np.int32)
    bounds[0::2] = at
    bounds[1::2] = at + sizes
    nulls = length < 0
    validity = None
    null_count = 0
    if nulls.any():
        valid = np.ones(2 * n - 1, dtype=np.bool_)
        valid[0::2] = ~nulls
        validity = pa.py_buffer(np.packbits(valid, bitorder="little"))
        null_count = int(nulls.sum())
    spans = pa.Array.from_buffers(
        pa.binary(), 2 * n - 1, [validity, pa.py_buffer(bounds), data], null_count=null_count
    )
    return spans.take(pa.array(np.arange(0, 2 * n, 2, dtype=np.int32)))
