"""Kafka RecordBatch v2 (magic 2): encode and decode, sans-IO.

Layout: ``docs/spark-sink.md`` section "Payload format" (Kafka's ``DefaultRecordBatch`` /
``DefaultRecord``). Every integer in the batch header is big-endian; every integer inside a record is
a zigzag varint. The CRC is CRC-32C (Castagnoli) over ``attributes .. end of batch``.

The sink stores exactly one RecordBatch per StreamRecordBatch payload, as AutoMQ does. Encoding is
column-wise (lists of keys, values, timestamps, headers) so the executor-side loop does the minimum
per record; decoding returns columns for the same reason. Bad bytes give
:class:`~s3stream.errors.CorruptionError` (naming the source and byte position) and nothing else.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import crc32c

from s3stream.errors import CorruptionError, InvalidArgumentError
from s3stream.native import NATIVE

BATCH_HEADER = struct.Struct(
    ">"
    "q"  # base offset: offset of the first record (the stream offset once appended)
    "i"  # length: bytes after this field (partition leader epoch .. end of batch)
    "i"  # partition leader epoch: -1 when unknown (not covered by the CRC)
    "b"  # magic: 2
    "I"  # crc: CRC-32C of attributes .. end of batch
    "h"  # attributes: bits 0-2 compression (0 only), bit 3 timestamp type, 4 transactional, 5 control
    "i"  # last offset delta: offset delta of the last record (record count - 1 for the sink)
    "q"  # first timestamp, ms since the epoch
    "q"  # max timestamp, ms since the epoch
    "q"  # producer id: -1 (no idempotent producer)
    "h"  # producer epoch: -1
    "i"  # base sequence: -1
    "i"  # record count
)
BATCH_HEADER_SIZE = BATCH_HEADER.size
LENGTH_FIELD_END = struct.calcsize(">qi")
"""Where the bytes counted by the length field start."""
CRC_OFFSET = struct.calcsize(">qiib")
ATTRIBUTES_OFFSET = struct.calcsize(">qiibI")
_CRC = struct.Struct(">I")
_BASE_OFFSET = struct.Struct(">q")
assert BATCH_HEADER_SIZE == 61
assert CRC_OFFSET + _CRC.size == ATTRIBUTES_OFFSET

MAGIC = 2
COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_MASK = 0x10
CONTROL_MASK = 0x20
NO_PARTITION_LEADER_EPOCH = -1
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1

RECORD_MAX_COUNT = (1 << 31) - 1
BATCH_MAX_BYTES = (1 << 31) - 1
"""The length field is an int32."""

Header = tuple[str, bytes | None]


class _Truncated(Exception):
    """Internal: a varint or field runs past the end (translated to CorruptionError)."""


def _zigzag_varint(n: int) -> bytes:
    """Kafka's signed varint: zigzag, then 7 bits per byte, low groups first."""
    z = (n << 1) ^ (n >> 63)
    z &= 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


_SMALL_MAX = 1 << 16


def _small_varints() -> list[bytes]:
    """The varints of 0 .. 65535 (zigzag values 0, 2, .. 2^17 - 2: one, two or three bytes), built
    without a call per value."""
    one = [bytes((z,)) for z in range(0, 0x80, 2)]
    two = [bytes(((z & 0x7F) | 0x80, z >> 7)) for z in range(0x80, 0x4000, 2)]
    three = [
        bytes(((z & 0x7F) | 0x80, ((z >> 7) & 0x7F) | 0x80, z >> 14))
        for z in range(0x4000, 2 * _SMALL_MAX, 2)
    ]
    return one + two + three


_VARINT_SMALL: list[bytes] | None = None
"""Encoded varints of 0 .. 65535: lengths and deltas of a typical record are table lookups. Built on
first use (50 ms), which a process on the compiled codec never pays."""


def _small() -> list[bytes]:
    global _VARINT_SMALL
    table = _VARINT_SMALL
    if table is None:
        table = _VARINT_SMALL = _small_varints()  # threads racing here build equal tables
    return table


_NULL = _zigzag_varint(-1)
_HEADER_PLACEHOLDER = bytes(BATCH_HEADER_SIZE)
_ZERO = b"\x00"


def varint(n: int) -> bytes:
    """The zigzag varint of ``n`` (a signed 64-bit value)."""
    if 0 <= n < _SMALL_MAX:
        return _small()[n]
    if not -(1 << 63) <= n < 1 << 63:
        raise InvalidArgumentError(f"varint value {n} does not fit in 64 bits")
    return _zigzag_varint(n)


def decode_varint(buf: bytes | bytearray | memoryview, pos: int) -> tuple[int, int]:
    """Decode a zigzag varint at ``pos``; returns (value, position after it).

    Raises ``_Truncated`` past the end and CorruptionError-worthy ``ValueError`` for more than 10 bytes.
    """
    b = buf[pos] if pos < len(buf) else -1
    if 0 <= b < 0x80:
        return (b >> 1) ^ -(b & 1), pos + 1
    z = 0
    shift = 0
    end = len(buf)
    while True:
        if pos >= end:
            raise _Truncated
        b = buf[pos]
        pos += 1
        z |= (b & 0x7F) << shift
        if b < 0x80:
            break
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")
    z &= 0xFFFFFFFFFFFFFFFF
    return (z >> 1) ^ -(z & 1), pos


def _encode_headers(headers: Sequence[Header]) -> bytes:
    parts = [varint(len(headers))]
    for hkey, hvalue in headers:
        kb = hkey.encode("utf-8")
        parts.append(varint(len(kb)))
        parts.append(kb)
        if hvalue is None:
            parts.append(_NULL)
        else:
            parts.append(varint(len(hvalue)))
            parts.append(hvalue)
    return b"".join(parts)


def encode_batch(
    keys: Sequence[bytes | None],
    values: Sequence[bytes | None],
    timestamps_ms: Sequence[int],
    headers: Sequence[Sequence[Header] | None] | None = None,
    *,
    base_offset: int = 0,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
) -> bytearray:
    """One RecordBatch v2 of ``len(values)`` records with offset deltas 0, 1, ..., uncompressed.

    ``headers`` is one header list (or None for none) per record, or None for no headers at all.
    Producer id, producer epoch and base sequence are -1 (no idempotent producer); attributes are 0
    (no compression, create time, not transactional). Returns a new bytearray (one copy of the
    record bytes), so the caller can still patch the base offset.
    """
    count = len(values)
    if count == 0:
        raise InvalidArgumentError("a record batch needs at least one record")
    if count > RECORD_MAX_COUNT:
        raise InvalidArgumentError(f"{count} records exceed the batch maximum {RECORD_MAX_COUNT}")
    if len(keys) != count or len(timestamps_ms) != count or (headers is not None and len(headers) != count):
        raise InvalidArgumentError("keys, values, timestamps and headers must have the same length")
    first_ts = timestamps_ms[0]
    max_ts = max(timestamps_ms)
    out = (
        None
        if NATIVE is None
        else NATIVE.kafka_records(keys, values, timestamps_ms, headers, first_ts, BATCH_HEADER_SIZE)
    )
    if out is None:  # not built, or inputs only the Python loop takes (or rejects)
        out = _encode_records(keys, values, timestamps_ms, headers, first_ts)
    total = len(out)
    if total > BATCH_MAX_BYTES:
        raise InvalidArgumentError(f"record batch of {total} bytes exceeds {BATCH_MAX_BYTES}")
    BATCH_HEADER.pack_into(
        out,
        0,
        base_offset,
        total - LENGTH_FIELD_END,
        partition_leader_epoch,
        MAGIC,
        0,
        0,
        count - 1,
        first_ts,
        max_ts,
        NO_PRODUCER_ID,
        NO_PRODUCER_EPOCH,
        NO_SEQUENCE,
        count,
    )
    _CRC.pack_into(out, CRC_OFFSET, crc32c.crc32c(memoryview(out)[ATTRIBUTES_OFFSET:]))
    return out


def _encode_records(
    keys: Sequence[bytes | None],
    values: Sequence[bytes | None],
    timestamps_ms: Sequence[int],
    headers: Sequence[Sequence[Header] | None] | None,
    first_ts: int,
) -> bytearray:
    """A zeroed batch header, then the records with offset deltas 0, 1, ... (pure Python; the
    compiled ``kafka_records`` of :mod:`s3stream.native` returns the same bytes)."""
    count = len(values)
    small = _small()
    small_max = _SMALL_MAX
    null = _NULL
    zero = _ZERO
    no_headers = _ZERO  # varint(0)
    parts: list[bytes | bytearray | memoryview] = [_HEADER_PLACEHOLDER]
    extend = parts.extend
    for i in range(count):
        key = keys[i]
        value = values[i]
        tsd = timestamps_ms[i] - first_ts
        tsd_v = small[tsd] if 0 <= tsd < small_max else varint(tsd)
        od_v = small[i] if i < small_max else varint(i)
        hdrs = None if headers is None else headers[i]
        hdr_bytes = no_headers if not hdrs else _encode_headers(hdrs)
        if key is None:
            key_v = null
            key = b""
        else:
            n = len(key)
            key_v = small[n] if n < small_max else varint(n)
        if value is None:
            value_v = null
            value = b""
        else:
            n = len(value)
            value_v = small[n] if n < small_max else varint(n)
        body_len = (
            1 + len(tsd_v) + len(od_v) + len(key_v) + len(key) + len(value_v) + len(value) + len(hdr_bytes)
        )
        extend(
            (
                small[body_len] if body_len < small_max else varint(body_len),
                zero,
                tsd_v,
                od_v,
                key_v,
                key,
                value_v,
                value,
                hdr_bytes,
            )
        )
    return bytearray().join(parts)


def set_base_offset(buf: bytearray | memoryview, pos: int, base_offset: int) -> None:
    """Overwrite the base offset of the batch at ``pos`` (the field is outside the CRC)."""
    _BASE_OFFSET.pack_into(buf, pos, base_offset)


@dataclass(frozen=True, slots=True)
class KafkaRecord:
    """One decoded record (row view; the column view is :class:`DecodedBatch`)."""

    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()


@dataclass(frozen=True, slots=True)
class DecodedBatch:
    """A decoded RecordBatch v2: header fields and one list per record column."""

    base_offset: int
    partition_leader_epoch: int
    attributes: int
    last_offset_delta: int
    first_timestamp_ms: int
    max_timestamp_ms: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    offsets: list[int]
    timestamps_ms: list[int]
    keys: list[bytes | None]
    values: list[bytes | None]
    headers: list[list[Header]]

    @property
    def record_count(self) -> int:
        return len(self.values)

    def records(self) -> list[KafkaRecord]:
        return [
            KafkaRecord(o, t, k, v, tuple(h))
            for o, t, k, v, h in zip(
                self.offsets, self.timestamps_ms, self.keys, self.values, self.headers, strict=True
            )
        ]


def batch_size_at(buf: bytes | bytearray | memoryview, pos: int = 0) -> int | None:
    """The total size of the batch starting at ``pos``, or None if fewer than 12 bytes remain."""
    if len(buf) - pos < LENGTH_FIELD_END:
        return None
    _, length = struct.unpack_from(">qi", buf, pos)
    return LENGTH_FIELD_END + int(length)


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """The verified header of one RecordBatch v2 (its records not yet parsed)."""

    base_offset: int
    """The stored base offset, or the caller's override."""
    partition_leader_epoch: int
    attributes: int
    last_offset_delta: int
    first_timestamp_ms: int
    max_timestamp_ms: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int
    records_start: int
    """Position of the first record in the buffer."""
    end: int
    """Position after the batch."""

    @property
    def log_append_time(self) -> bool:
        return bool(self.attributes & TIMESTAMP_TYPE_MASK)


def read_batch_header(
    buf: bytes | bytearray | memoryview,
    pos: int = 0,
    *,
    source: str = "<buffer>",
    base_offset: int | None = None,
) -> BatchHeader:
    """Verify the batch at ``pos`` up to its records: the header fits, magic 2, the length fits the
    buffer, the CRC-32C of ``attributes .. end`` matches, no compression, not a control batch, a
    record count >= 0. Raises :class:`CorruptionError` otherwise."""
    view = memoryview(buf) if not isinstance(buf, memoryview) else buf
    if len(view) - pos < BATCH_HEADER_SIZE:
        raise CorruptionError("truncated Kafka record batch header", source=source, position=pos)
    (
        stored_base,
        length,
        leader_epoch,
        magic,
        crc,
        attributes,
        last_delta,
        first_ts,
        max_ts,
        producer_id,
        producer_epoch,
        base_sequence,
        count,
    ) = BATCH_HEADER.unpack_from(view, pos)
    if magic != MAGIC:
        raise CorruptionError(
            f"Kafka record batch magic {magic}, expected {MAGIC}", source=source, position=pos
        )
    end = pos + LENGTH_FIELD_END + length
    if length < BATCH_HEADER_SIZE - LENGTH_FIELD_END or end > len(view):
        raise CorruptionError(
            f"Kafka record batch length {length} does not fit the buffer", source=source, position=pos
        )
    if crc32c.crc32c(view[pos + ATTRIBUTES_OFFSET : end]) != crc:
        raise CorruptionError("Kafka record batch CRC-32C mismatch", source=source, position=pos)
    if attributes & COMPRESSION_MASK:
        raise CorruptionError(
            f"compressed Kafka record batch (codec {attributes & COMPRESSION_MASK}) is not supported",
            source=source,
            position=pos,
        )
    if attributes & CONTROL_MASK:
        raise CorruptionError("Kafka control batch is not supported", source=source, position=pos)
    if count < 0:
        raise CorruptionError(f"negative Kafka record count {count}", source=source, position=pos)
    return BatchHeader(
        stored_base if base_offset is None else base_offset,
        leader_epoch,
        attributes,
        last_delta,
        first_ts,
        max_ts,
        producer_id,
        producer_epoch,
        base_sequence,
        count,
        pos + BATCH_HEADER_SIZE,
        end,
    )


def decode_batch(
    buf: bytes | bytearray | memoryview,
    pos: int = 0,
    *,
    source: str = "<buffer>",
    base_offset: int | None = None,
) -> tuple[DecodedBatch, int]:
    """Decode and verify the batch at ``pos``; returns it and the position after it.

    ``base_offset`` (the stream offset of the StreamRecordBatch) overrides the stored base offset
    when given. Raises :class:`CorruptionError` for a truncated batch, a bad magic, a CRC mismatch,
    compressed or control batches, or records that do not parse exactly to the batch end.
    """
    view = memoryview(buf) if not isinstance(buf, memoryview) else buf
    h = read_batch_header(view, pos, source=source, base_offset=base_offset)
    body = bytes(view[h.records_start : h.end])
    append_time = h.max_timestamp_ms if h.log_append_time else None
    try:
        columns = (
            None
            if NATIVE is None
            else NATIVE.kafka_decode_records(
                body, h.record_count, h.base_offset, h.first_timestamp_ms, append_time
            )
        )
        if columns is None:  # not built, or bytes the Python loop rejects (it raises the error)
            columns = _decode_records(body, h.record_count, h.base_offset, h.first_timestamp_ms, append_time)
    except (_Truncated, ValueError, IndexError, UnicodeDecodeError) as exc:
        detail = "truncated record" if isinstance(exc, _Truncated) else str(exc)
        raise CorruptionError(f"bad Kafka record: {detail}", source=source, position=pos) from exc
    return (
        DecodedBatch(
            h.base_offset,
            h.partition_leader_epoch,
            h.attributes,
            h.last_offset_delta,
            h.first_timestamp_ms,
            h.max_timestamp_ms,
            h.producer_id,
            h.producer_epoch,
            h.base_sequence,
            *columns,
        ),
        h.end,
    )


def _nullable_bytes(body: bytes, pos: int, limit: int, what: str) -> tuple[bytes | None, int]:
    """A varint length, then that many bytes ending by ``limit`` (length -1: null)."""
    length, pos = decode_varint(body, pos)
    if length == -1:
        return None, pos
    if length < 0 or pos + length > limit:
        raise ValueError(f"{what} length {length} runs past the record end")
    return body[pos : pos + length], pos + length


def _decode_records(
    body: bytes, count: int, base: int, first_ts: int, append_time: int | None
) -> tuple[list[int], list[int], list[bytes | None], list[bytes | None], list[list[Header]]]:
    offsets: list[int] = []
    timestamps: list[int] = []
    keys: list[bytes | None] = []
    values: list[bytes | None] = []
    headers: list[list[Header]] = []
    pos = 0
    end = len(body)
    dv = decode_varint
    nb = _nullable_bytes
    for _ in range(count):
        length, pos = dv(body, pos)
        if length < 0 or pos + length > end:
            raise ValueError(f"record length {length} runs past the batch end")
        start = pos
        record_end = pos + length
        pos += 1  # attributes: unused
        ts_delta, pos = dv(body, pos)
        offset_delta, pos = dv(body, pos)
        key, pos = nb(body, pos, record_end, "key")
        keys.append(key)
        value, pos = nb(body, pos, record_end, "value")
        values.append(value)
        header_count, pos = dv(body, pos)
        if header_count < 0 or header_count > record_end - pos:
            raise ValueError(f"header count {header_count}")
        record_headers: list[Header] = []
        for _h in range(header_count):
            hkey, pos = nb(body, pos, record_end, "header key")
            if hkey is None:
                raise ValueError("null header key")
            hvalue, pos = nb(body, pos, record_end, "header value")
            record_headers.append((hkey.decode("utf-8"), hvalue))
        if pos != record_end:
            raise ValueError(f"record parsed to {pos - start} bytes, length says {length}")
        offsets.append(base + offset_delta)
        timestamps.append(first_ts + ts_delta if append_time is None else append_time)
        headers.append(record_headers)
    if pos != end:
        raise ValueError(f"{end - pos} bytes after the last record")
    return offsets, timestamps, keys, values, headers


def decode_batches(buf: bytes | bytearray | memoryview, *, source: str = "<buffer>") -> list[DecodedBatch]:
    """Every batch in ``buf`` back to back (a whole payload); trailing bytes are corruption."""
    out: list[DecodedBatch] = []
    pos = 0
    while pos < len(buf):
        batch, pos = decode_batch(buf, pos, source=source)
        out.append(batch)
    return out
