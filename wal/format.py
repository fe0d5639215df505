"""Pure codecs of the block WAL's persisted structures: the header copies and the record header.

The format is documented in docs/format.md, section "4. Block WAL"; this module is its code. No I/O,
no clock: bytes in, values out. Byte order is big-endian.
"""

from __future__ import annotations

import itertools
import operator
import struct
from collections.abc import Sequence
from typing import NamedTuple

from crc32c import crc32c

FORMAT_VERSION = 1

# --- WAL header (one copy per header slot; slot k is the block at physical k * block_size) ------
WAL_HEADER = struct.Struct(
    ">"
    "I"  # magic              0x57414C48 ("WALH")
    "H"  # version            FORMAT_VERSION
    "H"  # flags              reserved, 0
    "Q"  # seq                header write counter; the valid copy with the larger seq wins
    "I"  # wal_id             random at creation, repeated in every record header
    "I"  # block_size         alignment of every write
    "Q"  # capacity           device bytes used, header slots included
    "I"  # node_id
    "I"  # inflight_groups    write groups the writing session kept in flight at once (>= 1)
    "Q"  # node_epoch
    "Q"  # trim_offset        records whose offset is < trim_offset are trimmed
    "Q"  # start_offset       where recovery starts: the start of the first write group holding a
    #                             record at or past trim_offset (no untrimmed record lies below it), or
    #                             the aligned end of the log when there is none; it may lie above
    #                             trim_offset (e.g. past a padding record), never above such a record
    "Q"  # window             bytes past the log's end a crash may have written (torn-region bound)
    "Q"  # clean_end_offset   end of the log at a clean close; NO_CLEAN_END while open
    "I"  # crc                CRC32C of every byte before it
)
WAL_HEADER_MAGIC = 0x57414C48
WAL_HEADER_SIZE = WAL_HEADER.size
_WAL_HEADER_CRC_SPAN = WAL_HEADER_SIZE - 4
NO_CLEAN_END = (1 << 64) - 1

# --- Record header (precedes every record body and every padding record) -------------------------
RECORD_HEADER = struct.Struct(
    ">"
    "I"  # magic        DATA_MAGIC ("WALR") or PAD_MAGIC ("WALP")
    "B"  # version      FORMAT_VERSION
    "B"  # flags        FLAG_FIRST: first record of a write group
    "H"  # reserved     0
    "I"  # wal_id       equals the header's wal_id
    "Q"  # length       data: body bytes; padding: bytes skipped, this header included
    "Q"  # offset       logical offset of this header; equals its position in the log
    "I"  # body_crc     CRC32C of the body; 0 for padding
    "I"  # header_crc   CRC32C of the 32 bytes before it
)
RECORD_HEADER_SIZE = RECORD_HEADER.size
_RECORD_HEADER_CRC_SPAN = RECORD_HEADER_SIZE - 4
_RECORD_HEADER_PREFIX = struct.Struct(RECORD_HEADER.format[:-1])
"""The record header without its ``header_crc``: what that CRC covers."""
_RECORD_HEADER_FIXED = struct.Struct(RECORD_HEADER.format[:6])
"""magic .. wal_id: the same for every data record of a WAL but for the FIRST flag (the
:class:`RecordPacker` packs it and CRCs it once, then continues the header CRC over the rest)."""
_RECORD_HEADER_VARYING = struct.Struct(">" + RECORD_HEADER.format[6:-1])
"""length, offset, body_crc: what changes from one data record to the next."""
DATA_MAGIC = 0x57414C52
PAD_MAGIC = 0x57414C50
FLAG_FIRST = 0x01
_CRC = struct.Struct(">I")

assert WAL_HEADER_SIZE == 84
assert RECORD_HEADER_SIZE == 36
assert _RECORD_HEADER_PREFIX.size == _RECORD_HEADER_CRC_SPAN
assert _RECORD_HEADER_FIXED.format + _RECORD_HEADER_VARYING.format[1:] == _RECORD_HEADER_PREFIX.format
assert WAL_HEADER_SIZE <= 512, "a header copy must fit in one sector"


class WalHeader(NamedTuple):
    seq: int
    wal_id: int
    block_size: int
    capacity: int
    node_id: int
    inflight_groups: int
    node_epoch: int
    trim_offset: int
    start_offset: int
    window: int
    clean_end_offset: int


def encode_wal_header(h: WalHeader) -> bytes:
    body = WAL_HEADER.pack(
        WAL_HEADER_MAGIC,
        FORMAT_VERSION,
        0,
        h.seq,
        h.wal_id,
        h.block_size,
        h.capacity,
        h.node_id,
        h.inflight_groups,
        h.node_epoch,
        h.trim_offset,
        h.start_offset,
        h.window,
        h.clean_end_offset,
        0,
    )[:_WAL_HEADER_CRC_SPAN]
    return body + _CRC.pack(crc32c(body))


def decode_wal_header(data: bytes | bytearray | memoryview) -> WalHeader | None:
    """The header in ``data``, or None when the copy is missing, torn or from another format."""
    if len(data) < WAL_HEADER_SIZE:
        return None
    fields = WAL_HEADER.unpack_from(data)
    (
        magic,
        version,
        flags,
        seq,
        wal_id,
        block,
        cap,
        node_id,
        inflight,
        epoch,
        trim,
        start,
        wmax,
        clean,
        crc,
    ) = fields
    if magic != WAL_HEADER_MAGIC or version != FORMAT_VERSION or flags or inflight < 1:
        return None
    if crc32c(data[:_WAL_HEADER_CRC_SPAN]) != crc:
        return None
    return WalHeader(
        seq=seq,
        wal_id=wal_id,
        block_size=block,
        capacity=cap,
        node_id=node_id,
        inflight_groups=inflight,
        node_epoch=epoch,
        trim_offset=trim,
        start_offset=start,
        window=wmax,
        clean_end_offset=clean,
    )


class RecordHeader(NamedTuple):
    magic: int
    flags: int
    wal_id: int
    length: int
    offset: int
    body_crc: int


def pack_record_header(
    buf: bytearray | memoryview,
    pos: int,
    *,
    magic: int,
    flags: int,
    wal_id: int,
    length: int,
    offset: int,
    body_crc: int,
) -> None:
    """Write a record header with its CRC at ``buf[pos:pos + RECORD_HEADER_SIZE]``."""
    RECORD_HEADER.pack_into(buf, pos, magic, FORMAT_VERSION, flags, 0, wal_id, length, offset, body_crc, 0)
    _CRC.pack_into(
        buf, pos + _RECORD_HEADER_CRC_SPAN, crc32c(memoryview(buf)[pos : pos + _RECORD_HEADER_CRC_SPAN])
    )


def encode_record(*, body: bytes, offset: int, wal_id: int, first: bool) -> bytes:
    """Header plus body of a data record (tests and tools; the write path packs in place)."""
    buf = bytearray(RECORD_HEADER_SIZE + len(body))
    pack_record_header(
        buf,
        0,
        magic=DATA_MAGIC,
        flags=FLAG_FIRST if first else 0,
        wal_id=wal_id,
        length=len(body),
        offset=offset,
        body_crc=crc32c(body),
    )
    buf[RECORD_HEADER_SIZE:] = body
    return bytes(buf)


def encode_padding(*, offset: int, length: int, wal_id: int) -> bytes:
    buf = bytearray(RECORD_HEADER_SIZE)
    pack_record_header(
        buf, 0, magic=PAD_MAGIC, flags=FLAG_FIRST, wal_id=wal_id, length=length, offset=offset, body_crc=0
    )
    return bytes(buf)


def decode_record_header(data: bytes | bytearray | memoryview, pos: int = 0) -> RecordHeader | None:
    """The record header at ``data[pos:]``, or None when it is absent, torn or not ours."""
    if len(data) - pos < RECORD_HEADER_SIZE:
        return None
    magic, version, flags, reserved, wal_id, length, offset, body_crc, crc = RECORD_HEADER.unpack_from(
        data, pos
    )
    if magic != DATA_MAGIC and magic != PAD_MAGIC:
        return None
    if version != FORMAT_VERSION or reserved or flags & ~FLAG_FIRST:
        return None
    if crc32c(memoryview(data)[pos : pos + _RECORD_HEADER_CRC_SPAN]) != crc:
        return None
    if magic == PAD_MAGIC and (length < RECORD_HEADER_SIZE or body_crc or not flags & FLAG_FIRST):
        return None
    return RecordHeader(magic, flags, wal_id, length, offset, body_crc)


Body = bytes | bytearray | memoryview
"""A record body: a flat bytes-like object (a ``memoryview`` cast to bytes, so ``len`` counts bytes)."""
RecordBody = Body | tuple[Body, ...]
"""A body as the write path packs it: one bytes-like object, or a tuple of them written back to back."""

JOIN_BODY_MAX = 4096
"""Bodies up to this size are joined with their headers before the one copy into the write buffer (the
extra copy costs less than packing each in place does); larger bodies, and bodies given as parts, are
copied in place once."""


def body_len(body: RecordBody) -> int:
    """Bytes of a body or of its parts."""
    return sum(map(len, body)) if body.__class__ is tuple else len(body)


def body_crc(body: RecordBody) -> int:
    """CRC32C of a body, or of its parts joined (computed part by part, no joined copy)."""
    if not isinstance(body, tuple):
        return crc32c(body)
    crc = 0
    for part in body:
        crc = crc32c(part, crc)
    return crc


class RecordPacker:
    """Packs the data records of one write group (header, header CRC, body) into a write buffer.

    The write path's encoder of :data:`RECORD_HEADER` (same bytes as :func:`pack_record_header`). A
    header is packed as its fixed part (magic .. wal_id, packed and CRCed once per WAL, FIRST flag or
    not), its varying part (length, offset, body CRC) and the header CRC, continued from the fixed
    part's. Each step runs over the whole group at once (``map``: no bytecode round per record), and
    runs of small bodies reach the buffer in one join and one copy: about half the CPU per 1 KiB
    record of packing each record in place.
    """

    __slots__ = ("_first", "_rest")

    def __init__(self, wal_id: int) -> None:
        first, rest = (
            _RECORD_HEADER_FIXED.pack(DATA_MAGIC, FORMAT_VERSION, flags, 0, wal_id)
            for flags in (FLAG_FIRST, 0)
        )
        self._first = (first, crc32c(first))
        self._rest = (rest, crc32c(rest))

    def pack(self, view: memoryview, offset: int, bodies: Sequence[RecordBody]) -> list[int]:
        """Write ``bodies`` as data records at ``view[0:]``, the first at logical ``offset`` flagged
        FIRST; returns each record's offset followed by the offset past the last (``len(bodies) + 1``
        values). ``bodies`` must not be empty; ``view`` must hold them."""
        count = len(bodies)
        try:
            crcs = list(map(crc32c, bodies))  # type: ignore[arg-type]
            lens = list(map(len, bodies))
            parts = False
        except TypeError:  # some body is given as parts (a tuple)
            crcs = list(map(body_crc, bodies))
            lens = list(map(body_len, bodies))
            parts = True
        offs = list(
            map(
                operator.add,
                itertools.accumulate(lens, initial=offset),
                range(0, RECORD_HEADER_SIZE * (count + 1), RECORD_HEADER_SIZE),
            )
        )
        varying = list(map(_RECORD_HEADER_VARYING.pack, lens, offs, crcs))
        fixed, fixed_crc = self._rest
        first, first_crc = self._first
        hcrcs = list(map(_CRC.pack, map(crc32c, varying, itertools.repeat(fixed_crc, count))))
        hcrcs[0] = _CRC.pack(crc32c(varying[0], first_crc))
        # Records copied in place: bodies above JOIN_BODY_MAX and bodies given as parts (a join would
        # copy them twice); the runs between them are joined, each with one copy into the buffer.
        if parts or max(lens) > JOIN_BODY_MAX:
            alone = [i for i in range(count) if lens[i] > JOIN_BODY_MAX or bodies[i].__class__ is tuple]
        else:
            alone = []
        lo = 0
        for hi in (*alone, count):
            if hi > lo:
                pieces: list[RecordBody] = [fixed] * (4 * (hi - lo))
                if hi - lo == count:  # (the usual group: one run, no copies of the lists)
                    pieces[1::4] = varying
                    pieces[2::4] = hcrcs
                    pieces[3::4] = bodies
                else:
                    pieces[1::4] = varying[lo:hi]
                    pieces[2::4] = hcrcs[lo:hi]
                    pieces[3::4] = bodies[lo:hi]
                if lo == 0:
                    pieces[0] = first
                view[offs[lo] - offset : offs[hi] - offset] = b"".join(pieces)  # type: ignore[arg-type]
            if hi < count:
                pos = offs[hi] - offset
                view[pos : pos + RECORD_HEADER_SIZE] = (first if hi == 0 else fixed) + varying[hi] + hcrcs[hi]
                pos += RECORD_HEADER_SIZE
                body = bodies[hi]
                for part in body if isinstance(body, tuple) else (body,):
                    view[pos : pos + len(part)] = part
                    pos += len(part)
            lo = hi + 1
        return offs
