"""Codec of the engine's WAL record bodies: a plain record batch, an atomic group or KV mutations.

Layout: ``docs/format.md`` section "5. WAL record bodies". The first byte tells the body type:
``0x22`` is one plain StreamRecordBatch (AutoMQ's layout, :mod:`s3stream.record`), ``0x5A`` an atomic
group (several batches + KV puts written and recovered all-or-nothing), ``0x4B`` KV mutations (put,
put-if-absent, delete: every KV change goes through the WAL, so replay sees one total order). The
WAL record around the body carries its CRC, so bodies have none of their own. Pure: bytes in, values
out. A plain body is built as two parts, (record header, payload), which the WAL writes back to back
as one record: the payload is never copied to join them (the bytes on disk are the same).
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from s3stream.engine.walport import Body
from s3stream.errors import CorruptionError
from s3stream.record import RECORD_HEADER, RECORD_MAGIC, StreamRecordBatch, decode_record

ATOMIC_GROUP_MAGIC = 0x5A
ATOMIC_GROUP_VERSION = 1

GROUP_HEADER = struct.Struct(
    ">"
    "B"  # magic, 0x5A
    "B"  # version, 1
    "H"  # reserved, zero
    "I"  # batch count
    "I"  # KV put count
)
GROUP_HEADER_SIZE = GROUP_HEADER.size
assert GROUP_HEADER_SIZE == 12

KV_HEADER = struct.Struct(
    ">"
    "H"  # key length in bytes (UTF-8)
    "I"  # value length in bytes
)
KV_HEADER_SIZE = KV_HEADER.size
assert KV_HEADER_SIZE == 6
KV_KEY_MAX_BYTES = (1 << 16) - 1

KV_BODY_MAGIC = 0x4B
KV_BODY_VERSION = 1

KV_BODY_HEADER = struct.Struct(
    ">"
    "B"  # magic, 0x4B
    "B"  # version, 1
    "H"  # reserved, zero
    "I"  # mutation count
)
KV_BODY_HEADER_SIZE = KV_BODY_HEADER.size
assert KV_BODY_HEADER_SIZE == 8

KV_MUTATION_HEADER = struct.Struct(
    ">"
    "B"  # operation: 1 put, 2 put if absent, 3 delete
    "B"  # reserved, zero
    "H"  # key length in bytes (UTF-8)
    "I"  # value length in bytes (0 for a delete)
)
KV_MUTATION_HEADER_SIZE = KV_MUTATION_HEADER.size
assert KV_MUTATION_HEADER_SIZE == 8

assert len({RECORD_MAGIC, ATOMIC_GROUP_MAGIC, KV_BODY_MAGIC}) == 3


class KvOp(enum.IntEnum):
    PUT = 1
    PUT_IF_ABSENT = 2
    DELETE = 3


@dataclass(frozen=True, slots=True)
class KvMutation:
    """One KV change as the WAL holds it (a delete has an empty value)."""

    op: KvOp
    key: str
    value: bytes = b""


@dataclass(frozen=True, slots=True)
class WalBody:
    """A decoded WAL body: batches in write order and KV changes in write order."""

    batches: tuple[StreamRecordBatch, ...]
    kv_puts: tuple[tuple[str, bytes], ...] = ()
    """An atomic group's KV puts."""
    kv_ops: tuple[KvMutation, ...] = ()
    """Every KV change of the body in write order (a group's puts as ``KvOp.PUT``)."""


def plain_parts(
    stream_id: int, epoch: int, base_offset: int, count: int, payload: Body
) -> tuple[bytes, Body]:
    """A plain body as (header, payload) parts: ``StreamRecordBatch.encode()``'s bytes once joined,
    without the frozen dataclass and without copying ``payload``."""
    return RECORD_HEADER.pack(RECORD_MAGIC, stream_id, epoch, base_offset, count, len(payload)), payload


def encode_plain(batch: StreamRecordBatch) -> bytes:
    return batch.encode()


def encode_group(batches: Sequence[StreamRecordBatch], kv_puts: Sequence[tuple[str, bytes]]) -> bytes:
    """An atomic group body. Keys must be at most ``KV_KEY_MAX_BYTES`` of UTF-8 (checked by the caller)."""
    parts: list[bytes] = [
        GROUP_HEADER.pack(ATOMIC_GROUP_MAGIC, ATOMIC_GROUP_VERSION, 0, len(batches), len(kv_puts))
    ]
    parts.extend(batch.encode() for batch in batches)
    for key, value in kv_puts:
        key_bytes = key.encode()
        assert len(key_bytes) <= KV_KEY_MAX_BYTES
        parts.append(KV_HEADER.pack(len(key_bytes), len(value)))
        parts.append(key_bytes)
        parts.append(bytes(value))
    return b"".join(parts)


def encode_kv(mutations: Sequence[KvMutation]) -> bytes:
    """A KV mutations body. Keys must be at most ``KV_KEY_MAX_BYTES`` of UTF-8 (checked by the caller)."""
    parts: list[bytes] = [KV_BODY_HEADER.pack(KV_BODY_MAGIC, KV_BODY_VERSION, 0, len(mutations))]
    for mutation in mutations:
        key_bytes = mutation.key.encode()
        assert len(key_bytes) <= KV_KEY_MAX_BYTES
        assert mutation.op is not KvOp.DELETE or not mutation.value
        parts.append(KV_MUTATION_HEADER.pack(mutation.op, 0, len(key_bytes), len(mutation.value)))
        parts.append(key_bytes)
        parts.append(bytes(mutation.value))
    return b"".join(parts)


def group_size(batches: Sequence[StreamRecordBatch], kv_puts: Sequence[tuple[str, bytes]]) -> int:
    """Encoded size of a group body, without encoding it."""
    return (
        GROUP_HEADER_SIZE
        + sum(b.encoded_size for b in batches)
        + sum(KV_HEADER_SIZE + len(k.encode()) + len(v) for k, v in kv_puts)
    )


def decode_body(buf: bytes | bytearray | memoryview, *, source: str = "<wal>", position: int = 0) -> WalBody:
    """Decode a body; :class:`CorruptionError` (naming ``source`` and ``position``) on anything else."""
    if len(buf) == 0:
        raise CorruptionError("empty WAL body", source=source, position=position)
    magic = buf[0]
    if magic == RECORD_MAGIC:
        batch, end = decode_record(buf, 0, source=source, base_position=position)
        if end != len(buf):
            raise CorruptionError(
                "trailing bytes after a plain WAL body", source=source, position=position + end
            )
        return WalBody((batch,))
    if magic == KV_BODY_MAGIC:
        return _decode_kv(buf, source=source, position=position)
    if magic != ATOMIC_GROUP_MAGIC:
        raise CorruptionError(f"unknown WAL body type 0x{magic:02x}", source=source, position=position)
    if len(buf) < GROUP_HEADER_SIZE:
        raise CorruptionError("truncated atomic group header", source=source, position=position)
    _, version, reserved, batch_count, kv_count = GROUP_HEADER.unpack_from(buf, 0)
    if version != ATOMIC_GROUP_VERSION or reserved != 0:
        raise CorruptionError(
            f"unsupported atomic group version {version} / reserved {reserved}",
            source=source,
            position=position,
        )
    pos = GROUP_HEADER_SIZE
    batches: list[StreamRecordBatch] = []
    for _ in range(batch_count):
        batch, pos = decode_record(buf, pos, source=source, base_position=position)
        batches.append(batch)
    kv_puts: list[tuple[str, bytes]] = []
    for _ in range(kv_count):
        if len(buf) - pos < KV_HEADER_SIZE:
            raise CorruptionError("truncated KV put header", source=source, position=position + pos)
        key_len, value_len = KV_HEADER.unpack_from(buf, pos)
        key, value, end = _key_value(
            buf, pos, KV_HEADER_SIZE, key_len, value_len, what="KV put", source=source, position=position
        )
        kv_puts.append((key, value))
        pos = end
    if pos != len(buf):
        raise CorruptionError("trailing bytes after an atomic group", source=source, position=position + pos)
    return WalBody(tuple(batches), tuple(kv_puts), tuple(KvMutation(KvOp.PUT, k, v) for k, v in kv_puts))


def _decode_kv(buf: bytes | bytearray | memoryview, *, source: str, position: int) -> WalBody:
    if len(buf) < KV_BODY_HEADER_SIZE:
        raise CorruptionError("truncated KV mutations header", source=source, position=position)
    _, version, reserved, count = KV_BODY_HEADER.unpack_from(buf, 0)
    if version != KV_BODY_VERSION or reserved != 0:
        raise CorruptionError(
            f"unsupported KV mutations version {version} / reserved {reserved}",
            source=source,
            position=position,
        )
    pos = KV_BODY_HEADER_SIZE
    mutations: list[KvMutation] = []
    for _ in range(count):
        if len(buf) - pos < KV_MUTATION_HEADER_SIZE:
            raise CorruptionError("truncated KV mutation header", source=source, position=position + pos)
        op_byte, reserved, key_len, value_len = KV_MUTATION_HEADER.unpack_from(buf, pos)
        if reserved != 0 or op_byte not in KvOp.__members__.values():
            raise CorruptionError(
                f"unknown KV operation {op_byte} / reserved {reserved}",
                source=source,
                position=position + pos,
            )
        op = KvOp(op_byte)
        if op is KvOp.DELETE and value_len != 0:
            raise CorruptionError("KV delete with a value", source=source, position=position + pos)
        key, value, end = _key_value(
            buf, pos, KV_MUTATION_HEADER_SIZE, key_len, value_len, what="KV mutation", source=source,
            position=position,
        )  # fmt: skip
        mutations.append(KvMutation(op, key, value))
        pos = end
    if pos != len(buf):
        raise CorruptionError("trailing bytes after KV mutations", source=source, position=position + pos)
    return WalBody((), (), tuple(mutations))


def _key_value(
    buf: bytes | bytearray | memoryview,
    pos: int,
    header_size: int,
    key_len: int,
    value_len: int,
    *,
    what: str,
    source: str,
    position: int,
) -> tuple[str, bytes, int]:
    """The key and value after the item header at ``pos``, and the position after them."""
    start = pos + header_size
    end = start + key_len + value_len
    if end > len(buf):
        raise CorruptionError(f"truncated {what}", source=source, position=position + pos)
    try:
        key = bytes(buf[start : start + key_len]).decode()
    except UnicodeDecodeError as exc:
        raise CorruptionError("KV key is not UTF-8", source=source, position=position + pos) from exc
    return key, bytes(buf[start + key_len : end]), end
