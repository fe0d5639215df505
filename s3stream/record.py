"""StreamRecordBatch: the record unit stored in the WAL and in object data blocks.

Layout: ``docs/format.md`` section "StreamRecordBatch" (AutoMQ's layout, magic 0x22, big-endian).
The payload is opaque (the Spark sink stores a Kafka RecordBatch v2 there).
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import repeat

from s3stream.errors import CorruptionError
from s3stream.model import FetchedBatch

RECORD_MAGIC = 0x22

RECORD_HEADER = struct.Struct(
    ">"
    "b"  # magic, 0x22
    "q"  # stream id
    "q"  # epoch of the writer
    "q"  # base offset: first offset of the batch
    "i"  # count: number of offsets; end offset (exclusive) = base offset + count
    "i"  # payload length in bytes
)
RECORD_HEADER_SIZE = RECORD_HEADER.size
assert RECORD_HEADER_SIZE == 33

RECORD_PAYLOAD_MAX_BYTES = (1 << 31) - 1 - RECORD_HEADER_SIZE


@dataclass(frozen=True, slots=True, init=False)
class StreamRecordBatch(FetchedBatch):
    """``count`` offsets of one stream starting at ``base_offset``, written under ``epoch``.

    A :class:`~s3stream.model.FetchedBatch` with its stream and epoch: fetch returns the records it
    read or found cached as they are, with no second object per record.
    """

    stream_id: int
    epoch: int

    def __init__(self, stream_id: int, epoch: int, base_offset: int, count: int, payload: bytes) -> None:
        # Hand-written to keep the persisted field order as the positional order (the generated one
        # would put the inherited fields first); fields set through their slots (frozen class).
        _set_stream_id(self, stream_id)
        _set_epoch(self, epoch)
        _set_base_offset(self, base_offset)
        _set_count(self, count)
        _set_payload(self, payload)

    @property
    def encoded_size(self) -> int:
        return RECORD_HEADER_SIZE + len(self.payload)

    def encode(self) -> bytes:
        return (
            RECORD_HEADER.pack(
                RECORD_MAGIC, self.stream_id, self.epoch, self.base_offset, self.count, len(self.payload)
            )
            + self.payload
        )

    def encode_into(self, buf: bytearray | memoryview, pos: int) -> int:
        """Write the encoded batch at ``pos``; returns the position after it."""
        RECORD_HEADER.pack_into(
            buf,
            pos,
            RECORD_MAGIC,
            self.stream_id,
            self.epoch,
            self.base_offset,
            self.count,
            len(self.payload),
        )
        end = pos + RECORD_HEADER_SIZE + len(self.payload)
        buf[pos + RECORD_HEADER_SIZE : end] = self.payload
        return end


def _slot_setter(name: str) -> Callable[[StreamRecordBatch, object], None]:
    setter: Callable[[StreamRecordBatch, object], None] = getattr(StreamRecordBatch, name).__set__
    return setter


_set_stream_id = _slot_setter("stream_id")
_set_epoch = _slot_setter("epoch")
_set_base_offset = _slot_setter("base_offset")
_set_count = _slot_setter("count")
_set_payload = _slot_setter("payload")
SLOT_SETTERS = (_set_stream_id, _set_epoch, _set_base_offset, _set_count, _set_payload)
"""Setters of a record's slots in persisted field order: decoders that build many records make them
with ``object.__new__(StreamRecordBatch)`` and these, without a call to ``__init__`` per record."""


def build_records(
    stream_ids: Sequence[int],
    epochs: Sequence[int],
    base_offsets: Sequence[int],
    counts: Sequence[int],
    payloads: Sequence[bytes],
) -> tuple[StreamRecordBatch, ...]:
    """Records from columns of their fields (equal lengths, values already checked), built with
    C-level loops: one ``map`` per field over the new records, no bytecode per record (~205 ns a
    record against ~290 ns for ``__new__`` and the five setters in a Python loop)."""
    new = object.__new__
    records = tuple(map(new, repeat(StreamRecordBatch, len(payloads))))
    for setter, column in zip(
        SLOT_SETTERS, (stream_ids, epochs, base_offsets, counts, payloads), strict=True
    ):
        deque(map(setter, records, column), maxlen=0)
    return records


def decode_record(
    buf: bytes | bytearray | memoryview, pos: int = 0, *, source: str = "<buffer>", base_position: int = 0
) -> tuple[StreamRecordBatch, int]:
    """Decode one batch at ``pos``; returns it and the position after it.

    Raises :class:`CorruptionError` (naming ``source`` and ``base_position + pos``) on a bad magic,
    a negative count or length, or a truncated buffer.
    """
    if len(buf) - pos < RECORD_HEADER_SIZE:
        raise CorruptionError("truncated record batch header", source=source, position=base_position + pos)
    magic, stream_id, epoch, base_offset, count, length = RECORD_HEADER.unpack_from(buf, pos)
    if magic != RECORD_MAGIC:
        raise CorruptionError(
            f"bad record batch magic 0x{magic & 0xFF:02x}", source=source, position=base_position + pos
        )
    if count < 0 or length < 0 or base_offset < 0:
        raise CorruptionError("negative record batch field", source=source, position=base_position + pos)
    start = pos + RECORD_HEADER_SIZE
    end = start + length
    if end > len(buf):
        raise CorruptionError("truncated record batch payload", source=source, position=base_position + pos)
    return StreamRecordBatch(stream_id, epoch, base_offset, count, bytes(buf[start:end])), end
