"""Sans-IO codec of the object format: bytes in, values out; no asyncio, no I/O.

Layout: ``docs/format.md`` section 2 (AutoMQ's data block, index block and footer byte for byte, plus
our checksum section between the index block and the footer, found through the footer's reserved
bytes). Every decoder returns a value or raises :class:`~s3stream.errors.CorruptionError` naming the
source and the byte position of the structure that failed; nothing else escapes.
"""

from __future__ import annotations

import functools
import operator
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from crc32c import crc32c

from s3stream.errors import CorruptionError
from s3stream.record import (
    RECORD_HEADER,
    RECORD_HEADER_SIZE,
    RECORD_MAGIC,
    SLOT_SETTERS,
    StreamRecordBatch,
    build_records,
)

I32_MAX = (1 << 31) - 1
I64_MAX = (1 << 63) - 1

# ---------------------------------------------------------------------------------------------
# Data block: header, then `record_count` encoded StreamRecordBatch back to back.
DATA_BLOCK_MAGIC = 0x5A
DATA_BLOCK_FLAG = 0x02
DATA_BLOCK_HEADER = struct.Struct(
    ">"
    "b"  # magic, 0x5A
    "b"  # flag, 0x02 (AutoMQ's default; readers ignore it)
    "i"  # record count: StreamRecordBatch entries in the block
    "i"  # data length: bytes after this header
)
DATA_BLOCK_HEADER_SIZE = DATA_BLOCK_HEADER.size

# ---------------------------------------------------------------------------------------------
# Index block: one entry per data block, sorted by (stream id, start offset); no count, no header.
INDEX_ENTRY = struct.Struct(
    ">"
    "q"  # stream id
    "q"  # start offset: base offset of the block's first record
    "i"  # end offset delta: end offset (exclusive) - start offset
    "i"  # record count: StreamRecordBatch entries in the block
    "q"  # start position: byte position of the block in the object
    "i"  # size: block bytes including its header
)
INDEX_ENTRY_SIZE = INDEX_ENTRY.size

# ---------------------------------------------------------------------------------------------
# Checksum section (ours): header, then one CRC32C per data block in index order.
CHECKSUM_SECTION_MAGIC = 0x53334353  # "S3CS"
CHECKSUM_SECTION_VERSION = 1
CHECKSUM_SECTION_HEADER = struct.Struct(
    ">"
    "I"  # magic, 0x53334353 ("S3CS")
    "H"  # version, 1
    "H"  # reserved, 0
    "I"  # block count: must equal the index entry count
    "I"  # CRC32C of the whole index block
)
CHECKSUM_SECTION_HEADER_SIZE = CHECKSUM_SECTION_HEADER.size
BLOCK_CRC = struct.Struct(
    ">I"  # CRC32C of one data block, header included
)
BLOCK_CRC_SIZE = BLOCK_CRC.size

# ---------------------------------------------------------------------------------------------
# Footer: AutoMQ's 48 bytes. AutoMQ zeroes bytes 12..39; we put the checksum-section locator there.
FOOTER_MAGIC = 0x88E241B785F4CFF7
FOOTER_EXTENSION_MAGIC = 0x53334558  # "S3EX"
FOOTER_EXTENSION_VERSION = 1
FOOTER = struct.Struct(
    ">"
    "q"  # index position: byte position of the index block (= total data block bytes)
    "i"  # index length: bytes of the index block
    "I"  # extension magic, 0x53334558 ("S3EX"); 0 in AutoMQ's objects (no checksum section)
    "H"  # extension version, 1
    "H"  # reserved, 0
    "I"  # checksum section length in bytes
    "I"  # CRC32C of the checksum section
    "8x"  # reserved, zero
    "I"  # CRC32C of footer bytes [0, 36)
    "Q"  # magic, 0x88E241B785F4CFF7
)
FOOTER_SIZE = FOOTER.size
FOOTER_CRC_OFFSET = struct.calcsize(">qiIHHII8x")
FOOTER_RESERVED_OFFSET = struct.calcsize(">qi")
FOOTER_ZERO_OFFSET = struct.calcsize(">qiIHHII")
"""Where the footer's last 8 reserved bytes start (zero in every version so far)."""
FOOTER_MAGIC_OFFSET = FOOTER_SIZE - struct.calcsize(">Q")

assert DATA_BLOCK_HEADER_SIZE == 10
assert INDEX_ENTRY_SIZE == 36
assert FOOTER_SIZE == 48
assert FOOTER_CRC_OFFSET == 36
assert FOOTER_RESERVED_OFFSET == 12
assert FOOTER_ZERO_OFFSET == FOOTER_CRC_OFFSET - 8 == 28
assert FOOTER_MAGIC_OFFSET == 40
assert CHECKSUM_SECTION_HEADER_SIZE == 16
assert BLOCK_CRC_SIZE == 4
assert RECORD_HEADER_SIZE == 33

TAIL_GUESS_BASE_BYTES = 8192
TAIL_GUESS_BYTES_PER_MIB = INDEX_ENTRY_SIZE + BLOCK_CRC_SIZE
"""The tail read guesses ``8192 + (size // 1 MiB) * 40`` bytes: AutoMQ's guess plus our CRC per block."""


def tail_guess_bytes(object_size: int) -> int:
    """How many bytes at the end of an object the first read fetches."""
    return min(object_size, TAIL_GUESS_BASE_BYTES + (object_size >> 20) * TAIL_GUESS_BYTES_PER_MIB)


# ---------------------------------------------------------------------------------------------
# Values


@dataclass(frozen=True, slots=True)
class IndexEntry:
    """One 36-byte index entry (AutoMQ's DataBlockIndex): where one data block is and what it holds."""

    stream_id: int
    start_offset: int
    end_offset: int
    record_count: int
    start_position: int
    size_bytes: int

    @property
    def end_position(self) -> int:
        return self.start_position + self.size_bytes

    @property
    def payload_bytes(self) -> int:
        """Payload bytes in the block (exact: size minus block header minus record headers)."""
        return self.size_bytes - DATA_BLOCK_HEADER_SIZE - self.record_count * RECORD_HEADER_SIZE


@dataclass(frozen=True, slots=True)
class Footer:
    """The decoded footer. ``checksum_section_length == 0`` means an AutoMQ object without checksums."""

    index_position: int
    index_length: int
    checksum_section_length: int = 0
    checksum_section_crc: int = 0

    @property
    def has_checksums(self) -> bool:
        return self.checksum_section_length > 0


@dataclass(frozen=True, slots=True)
class ChecksumSection:
    index_crc: int
    block_crcs: tuple[int, ...]

    @property
    def size_bytes(self) -> int:
        return checksum_section_size(len(self.block_crcs))


@dataclass(frozen=True, slots=True)
class ObjectTail:
    """Everything an object's tail tells: footer, index entries, block CRCs (None without checksums)."""

    footer: Footer
    index: tuple[IndexEntry, ...]
    block_crcs: tuple[int, ...] | None


@dataclass(frozen=True, slots=True)
class NeedBytes:
    """The tail given was too short: read again from ``start`` (inclusive) to the object's end."""

    start: int


def checksum_section_size(block_count: int) -> int:
    return CHECKSUM_SECTION_HEADER_SIZE + block_count * BLOCK_CRC_SIZE


def object_size(*, data_bytes: int, block_count: int, with_checksums: bool = True) -> int:
    """Total object bytes for ``block_count`` blocks holding ``data_bytes`` bytes."""
    extra = checksum_section_size(block_count) if with_checksums else 0
    return data_bytes + block_count * INDEX_ENTRY_SIZE + extra + FOOTER_SIZE


# ---------------------------------------------------------------------------------------------
# Data blocks


def encode_block_header(record_count: int, data_length: int) -> bytes:
    return DATA_BLOCK_HEADER.pack(DATA_BLOCK_MAGIC, DATA_BLOCK_FLAG, record_count, data_length)


def encode_block(records: Sequence[StreamRecordBatch]) -> bytes:
    """One data block holding ``records`` (caller keeps them to one stream, in offset order)."""
    data_length = sum(RECORD_HEADER_SIZE + len(r.payload) for r in records)
    buf = bytearray(DATA_BLOCK_HEADER_SIZE + data_length)
    DATA_BLOCK_HEADER.pack_into(buf, 0, DATA_BLOCK_MAGIC, DATA_BLOCK_FLAG, len(records), data_length)
    pos = DATA_BLOCK_HEADER_SIZE
    for record in records:
        pos = record.encode_into(buf, pos)
    return bytes(buf)


def check_block_header(
    buf: bytes | bytearray | memoryview, pos: int, entry: IndexEntry, *, source: str
) -> None:
    """Check the block header at ``buf[pos:]`` against its index entry."""
    where = entry.start_position
    if len(buf) - pos < DATA_BLOCK_HEADER_SIZE:
        raise CorruptionError("truncated data block header", source=source, position=where)
    magic, _flag, record_count, data_length = DATA_BLOCK_HEADER.unpack_from(buf, pos)
    if magic != DATA_BLOCK_MAGIC:
        raise CorruptionError(f"bad data block magic 0x{magic & 0xFF:02x}", source=source, position=where)
    if record_count != entry.record_count:
        raise CorruptionError(
            f"data block holds {record_count} records, its index entry says {entry.record_count}",
            source=source,
            position=where,
        )
    if data_length != entry.size_bytes - DATA_BLOCK_HEADER_SIZE:
        raise CorruptionError(
            f"data block length {data_length} disagrees with its index entry size {entry.size_bytes}",
            source=source,
            position=where,
        )


def decode_block(
    buf: bytes | bytearray | memoryview, pos: int, entry: IndexEntry, *, source: str
) -> tuple[StreamRecordBatch, ...]:
    """Decode the data block at ``buf[pos : pos + entry.size_bytes]`` and check it against ``entry``.

    Checks: header magic, counts and length; every record's magic, stream id and non-negative
    fields; offsets ascending without overlap, starting at the entry's start offset and ending at
    its end offset; the records filling the block exactly.
    """
    return decode_block_gapless(buf, pos, entry, source=source)[0]


def decode_block_gapless(
    buf: bytes | bytearray | memoryview, pos: int, entry: IndexEntry, *, source: str
) -> tuple[tuple[StreamRecordBatch, ...], bool]:
    """:func:`decode_block`, and whether each record starts where the previous one ended (no gap
    in the block's offsets; the format allows gaps, a reader returning a contiguous range does not)."""
    if len(buf) - pos < entry.size_bytes:
        raise CorruptionError("truncated data block", source=source, position=entry.start_position)
    check_block_header(buf, pos, entry, source=source)
    # slice payloads out of an immutable bytes object: one allocation and copy per payload
    data, lo = (
        (buf, pos) if isinstance(buf, bytes) else (bytes(memoryview(buf)[pos : pos + entry.size_bytes]), 0)
    )
    end = lo + entry.size_bytes
    last_header = end - RECORD_HEADER_SIZE
    cursor = lo + DATA_BLOCK_HEADER_SIZE
    shift = entry.start_position - lo
    stream = entry.stream_id
    expected_offset = entry.start_offset
    if entry.record_count and cursor <= last_header:
        magic, stream_id, _, base_offset, _, _ = RECORD_HEADER.unpack_from(data, cursor)
        if magic == RECORD_MAGIC and stream_id == stream and base_offset != expected_offset:
            raise CorruptionError(
                f"block starts at offset {base_offset}, its index entry says {expected_offset}",
                source=source,
                position=cursor + shift,
            )
    if entry.record_count and cursor <= last_header:
        uniform = _decode_uniform(data, cursor, end, entry)
        if uniform is not None:
            return uniform, True
    # The hot loop (one pass per record batch): locals only, the record built through its slots
    # (record.SLOT_SETTERS) inline, one check expression per batch.
    unpack = RECORD_HEADER.unpack_from
    header_size = RECORD_HEADER_SIZE
    good_magic = RECORD_MAGIC
    new = object.__new__
    cls = StreamRecordBatch
    set_stream_id, set_epoch, set_base_offset, set_count, set_payload = SLOT_SETTERS
    records: list[StreamRecordBatch] = []
    append = records.append
    gapless = True
    for _ in range(entry.record_count):
        if cursor > last_header:
            raise CorruptionError("truncated record batch header", source=source, position=cursor + shift)
        magic, stream_id, epoch, base_offset, count, length = unpack(data, cursor)
        start = cursor + header_size
        stop = start + length
        if (
            magic != good_magic
            or stream_id != stream
            or base_offset != expected_offset
            or (count | length) < 0
            or stop > end
        ):
            if (
                magic != good_magic
                or stream_id != stream
                or base_offset < expected_offset
                or (count | length) < 0
                or stop > end
            ):
                raise CorruptionError(
                    _record_problem(magic, stream_id, entry, count, length, base_offset, expected_offset),
                    source=source,
                    position=cursor + shift,
                )
            gapless = False  # a gap: allowed by the format
        record = new(cls)
        set_stream_id(record, stream_id)
        set_epoch(record, epoch)
        set_base_offset(record, base_offset)
        set_count(record, count)
        set_payload(record, data[start:stop])
        append(record)
        cursor = stop
        expected_offset = base_offset + count
    if cursor != end:
        raise CorruptionError(
            f"{end - cursor} unexpected bytes after the last record of the block",
            source=source,
            position=cursor + shift,
        )
    if expected_offset != entry.end_offset:
        raise CorruptionError(
            f"block records end at offset {expected_offset}, its index entry says {entry.end_offset}",
            source=source,
            position=entry.start_position,
        )
    return tuple(records), gapless


UNIFORM_ROWS_MAX = 128
"""Records one unpack of a uniform block reads: its flat tuple and column slices are the only
objects the garbage collector tracks (a tuple per record, all alive at once, drove young
collections)."""


@functools.lru_cache(maxsize=64)
def _uniform_layout(payload_bytes: int, rows: int) -> struct.Struct:
    """``rows`` records of ``payload_bytes`` each, back to back (header fields, then the payload)."""
    return struct.Struct(">" + (RECORD_HEADER.format.lstrip(">") + f"{payload_bytes}s") * rows)


def _decode_uniform(
    data: bytes, cursor: int, end: int, entry: IndexEntry
) -> tuple[StreamRecordBatch, ...] | None:
    """The records of ``data[cursor:end]`` if their payloads all have the first one's length and
    they continue each other without a gap from the entry's start to its end offset: header fields
    and payloads unpacked in runs of up to :data:`UNIFORM_ROWS_MAX` records into columns, the checks
    of the record-by-record loop done on whole columns, the records built by
    :func:`~s3stream.record.build_records`. Otherwise (sizes vary, a gap, or anything the loop
    reports as corruption) None: the loop decodes or reports it."""
    count = entry.record_count
    length = RECORD_HEADER.unpack_from(data, cursor)[5]
    stride = RECORD_HEADER_SIZE + length
    if length < 0 or end - cursor != count * stride:
        return None
    columns: list[list[Any]] = [[] for _ in range(7)]  # the record layout's seven fields
    magics, stream_ids, epochs, base_offsets, counts, lengths, payloads = columns
    left = count
    while left:
        rows = min(left, UNIFORM_ROWS_MAX)
        fields = _uniform_layout(length, rows).unpack_from(data, cursor)
        for k, column in enumerate(columns):
            column += fields[k::7]
        cursor += rows * stride
        left -= rows
    if (
        magics.count(RECORD_MAGIC) != count
        or stream_ids.count(entry.stream_id) != count
        or lengths.count(length) != count
        or min(counts) < 0
        or base_offsets[0] != entry.start_offset
    ):
        return None
    end_offsets = list(map(operator.add, base_offsets, counts))
    if end_offsets[-1] != entry.end_offset or end_offsets[:-1] != base_offsets[1:]:
        return None
    return build_records(stream_ids, epochs, base_offsets, counts, payloads)


def _record_problem(
    magic: int,
    stream_id: int,
    entry: IndexEntry,
    count: int,
    length: int,
    base_offset: int,
    expected_offset: int,
) -> str:
    if magic != RECORD_MAGIC:
        return f"bad record batch magic 0x{magic & 0xFF:02x}"
    if stream_id != entry.stream_id:
        return f"record of stream {stream_id} in a block of stream {entry.stream_id}"
    if count < 0 or length < 0:
        return "negative record batch count or length"
    if base_offset < expected_offset:
        return f"record batch at offset {base_offset} overlaps the previous one ending at {expected_offset}"
    return "record batch runs past the end of its data block"


def verify_crc(
    data: bytes | bytearray | memoryview, expected: int, *, what: str, source: str, position: int
) -> None:
    actual = crc32c(data)
    if actual != expected:
        raise CorruptionError(
            f"{what} CRC32C mismatch: stored 0x{expected:08x}, computed 0x{actual:08x}",
            source=source,
            position=position,
        )


# ---------------------------------------------------------------------------------------------
# Index block


IndexRow = tuple[int, int, int, int, int, int]
"""An :class:`IndexEntry`'s fields as a plain tuple, in field order (a writer keeps these while an
object is written: a tuple of ints is not tracked by the garbage collector, an entry object is)."""


def index_row(e: IndexEntry) -> IndexRow:
    return (e.stream_id, e.start_offset, e.end_offset, e.record_count, e.start_position, e.size_bytes)


def encode_index(entries: Iterable[IndexEntry]) -> bytes:
    return encode_index_rows([index_row(e) for e in entries])


def encode_index_rows(rows: Sequence[IndexRow]) -> bytes:
    """:func:`encode_index` of entries given as :data:`IndexRow` tuples."""
    buf = bytearray(len(rows) * INDEX_ENTRY_SIZE)
    pack = INDEX_ENTRY.pack_into
    for i, (stream_id, start_offset, end_offset, record_count, start_position, size_bytes) in enumerate(rows):
        pack(
            buf,
            i * INDEX_ENTRY_SIZE,
            stream_id,
            start_offset,
            end_offset - start_offset,
            record_count,
            start_position,
            size_bytes,
        )
    return bytes(buf)


def decode_index(
    buf: bytes | bytearray | memoryview, *, index_position: int, source: str
) -> tuple[IndexEntry, ...]:
    """Decode and check a whole index block whose first byte sits at ``index_position``.

    Checks: whole entries only; non-negative fields and at least one record per block; entries
    sorted by (stream id, start offset) without overlapping offset ranges within a stream; blocks
    laid out back to back from position 0 up to the index block.
    """
    if len(buf) % INDEX_ENTRY_SIZE:
        raise CorruptionError(
            f"index block length {len(buf)} is not a multiple of {INDEX_ENTRY_SIZE}",
            source=source,
            position=index_position,
        )
    entries: list[IndexEntry] = []
    next_position = 0
    prev_stream = -1
    prev_end = 0
    for pos in range(0, len(buf), INDEX_ENTRY_SIZE):
        stream_id, start, delta, count, start_position, size = INDEX_ENTRY.unpack_from(buf, pos)
        problem = None
        if stream_id < 0 or start < 0 or delta < 0 or count <= 0:
            problem = "negative field or empty block in index entry"
        elif size < DATA_BLOCK_HEADER_SIZE + count * RECORD_HEADER_SIZE:
            problem = f"index entry size {size} too small for {count} records"
        elif start_position != next_position:
            problem = (
                f"index entry points at byte {start_position}, the previous block ends at {next_position}"
            )
        elif stream_id < prev_stream or (stream_id == prev_stream and start < prev_end):
            problem = "index entries out of (stream id, offset) order or overlapping"
        elif start + delta > I64_MAX:
            problem = "index entry end offset overflows"
        if problem is not None:
            raise CorruptionError(problem, source=source, position=index_position + pos)
        entries.append(IndexEntry(stream_id, start, start + delta, count, start_position, size))
        next_position = start_position + size
        prev_stream = stream_id
        prev_end = start + delta
    if next_position != index_position:
        raise CorruptionError(
            f"data blocks end at byte {next_position} but the index block starts at {index_position}",
            source=source,
            position=index_position,
        )
    return tuple(entries)


# ---------------------------------------------------------------------------------------------
# Checksum section


def encode_checksum_section(index_crc: int, block_crcs: Sequence[int]) -> bytes:
    buf = bytearray(checksum_section_size(len(block_crcs)))
    CHECKSUM_SECTION_HEADER.pack_into(
        buf, 0, CHECKSUM_SECTION_MAGIC, CHECKSUM_SECTION_VERSION, 0, len(block_crcs), index_crc
    )
    struct.pack_into(f">{len(block_crcs)}I", buf, CHECKSUM_SECTION_HEADER_SIZE, *block_crcs)
    return bytes(buf)


def decode_checksum_section(
    buf: bytes | bytearray | memoryview, *, position: int, source: str
) -> ChecksumSection:
    """Decode a checksum section (its own CRC is checked by the caller, through the footer)."""
    if len(buf) < CHECKSUM_SECTION_HEADER_SIZE:
        raise CorruptionError("truncated checksum section", source=source, position=position)
    magic, version, reserved, block_count, index_crc = CHECKSUM_SECTION_HEADER.unpack_from(buf, 0)
    if magic != CHECKSUM_SECTION_MAGIC:
        raise CorruptionError(f"bad checksum section magic 0x{magic:08x}", source=source, position=position)
    if version != CHECKSUM_SECTION_VERSION or reserved != 0:
        raise CorruptionError(
            f"unsupported checksum section version {version}", source=source, position=position
        )
    if len(buf) != checksum_section_size(block_count):
        raise CorruptionError(
            f"checksum section of {len(buf)} bytes cannot hold {block_count} block CRCs",
            source=source,
            position=position,
        )
    crcs = struct.unpack_from(f">{block_count}I", buf, CHECKSUM_SECTION_HEADER_SIZE)
    return ChecksumSection(index_crc, tuple(crcs))


# ---------------------------------------------------------------------------------------------
# Footer


def encode_footer(footer: Footer) -> bytes:
    buf = bytearray(FOOTER_SIZE)
    if footer.has_checksums:
        FOOTER.pack_into(
            buf,
            0,
            footer.index_position,
            footer.index_length,
            FOOTER_EXTENSION_MAGIC,
            FOOTER_EXTENSION_VERSION,
            0,
            footer.checksum_section_length,
            footer.checksum_section_crc,
            0,
            FOOTER_MAGIC,
        )
        struct.pack_into(">I", buf, FOOTER_CRC_OFFSET, crc32c(memoryview(buf)[:FOOTER_CRC_OFFSET]))
    else:  # AutoMQ's footer: reserved bytes all zero
        FOOTER.pack_into(buf, 0, footer.index_position, footer.index_length, 0, 0, 0, 0, 0, 0, FOOTER_MAGIC)
    return bytes(buf)


def decode_footer(buf: bytes | bytearray | memoryview, *, position: int, source: str) -> Footer:
    """Decode the 48-byte footer found at ``position``. Reserved bytes all zero: AutoMQ's footer."""
    if len(buf) != FOOTER_SIZE:
        raise CorruptionError("truncated footer", source=source, position=position)
    (index_position, index_length, ext_magic, ext_version, ext_reserved, section_length, section_crc,
     footer_crc, magic) = FOOTER.unpack_from(buf, 0)  # fmt: skip
    if magic != FOOTER_MAGIC:
        raise CorruptionError(f"bad footer magic 0x{magic:016x}", source=source, position=position)
    view = memoryview(buf)
    if not any(view[FOOTER_RESERVED_OFFSET:FOOTER_MAGIC_OFFSET]):
        footer = Footer(index_position, index_length)
    elif ext_magic != FOOTER_EXTENSION_MAGIC:
        raise CorruptionError(
            f"footer reserved bytes hold unknown extension 0x{ext_magic:08x}",
            source=source,
            position=position,
        )
    else:
        verify_crc(view[:FOOTER_CRC_OFFSET], footer_crc, what="footer", source=source, position=position)
        if (
            ext_version != FOOTER_EXTENSION_VERSION
            or ext_reserved != 0
            or any(view[FOOTER_ZERO_OFFSET:FOOTER_CRC_OFFSET])
        ):
            raise CorruptionError(
                f"unsupported footer extension version {ext_version}", source=source, position=position
            )
        if section_length < CHECKSUM_SECTION_HEADER_SIZE:
            raise CorruptionError("checksum section too short", source=source, position=position)
        footer = Footer(index_position, index_length, section_length, section_crc)
    if index_position < 0 or index_length < 0 or index_length % INDEX_ENTRY_SIZE:
        raise CorruptionError(
            f"footer gives a bad index block [{index_position}, +{index_length})",
            source=source,
            position=position,
        )
    if footer.has_checksums and footer.checksum_section_length != checksum_section_size(
        index_length // INDEX_ENTRY_SIZE
    ):
        raise CorruptionError(
            "checksum section length disagrees with the index block length", source=source, position=position
        )
    return footer


# ---------------------------------------------------------------------------------------------
# Object tail: footer + index block (+ checksum section)


def decode_tail(
    tail: bytes | bytearray | memoryview, *, object_size: int, source: str
) -> ObjectTail | NeedBytes:
    """Parse the last ``len(tail)`` bytes of an object of ``object_size`` bytes.

    Returns the decoded, verified tail, or :class:`NeedBytes` when the tail does not reach back to
    the index block (read from ``NeedBytes.start`` and call again).
    """
    if object_size < FOOTER_SIZE or len(tail) < FOOTER_SIZE or len(tail) > object_size:
        raise CorruptionError(
            f"object of {object_size} bytes is too small for a footer", source=source, position=0
        )
    view = memoryview(tail)
    footer_position = object_size - FOOTER_SIZE
    footer = decode_footer(view[-FOOTER_SIZE:], position=footer_position, source=source)
    index_end = footer.index_position + footer.index_length
    section_end = index_end + footer.checksum_section_length
    if section_end > footer_position or (footer.has_checksums and section_end != footer_position):
        raise CorruptionError(
            f"index block [{footer.index_position}, {index_end}) and checksum section do not fit "
            f"before the footer at {footer_position}",
            source=source,
            position=footer_position,
        )
    tail_start = object_size - len(view)
    if footer.index_position < tail_start:
        return NeedBytes(footer.index_position)
    index_view = view[footer.index_position - tail_start : index_end - tail_start]
    block_crcs: tuple[int, ...] | None = None
    if footer.has_checksums:
        section_view = view[index_end - tail_start : section_end - tail_start]
        verify_crc(
            section_view,
            footer.checksum_section_crc,
            what="checksum section",
            source=source,
            position=index_end,
        )
        section = decode_checksum_section(section_view, position=index_end, source=source)
        verify_crc(
            index_view, section.index_crc, what="index block", source=source, position=footer.index_position
        )
        block_crcs = section.block_crcs
    index = decode_index(index_view, index_position=footer.index_position, source=source)
    if block_crcs is not None and len(block_crcs) != len(index):
        raise CorruptionError(
            "checksum section and index block disagree on the block count", source=source, position=index_end
        )
    return ObjectTail(footer, index, block_crcs)


def encode_tail(
    entries: Sequence[IndexEntry], block_crcs: Sequence[int] | None, *, index_position: int
) -> bytes:
    """Index block + checksum section (unless ``block_crcs`` is None) + footer."""
    return encode_tail_rows([index_row(e) for e in entries], block_crcs, index_position=index_position)


def encode_tail_rows(
    rows: Sequence[IndexRow], block_crcs: Sequence[int] | None, *, index_position: int
) -> bytes:
    """:func:`encode_tail` of entries given as :data:`IndexRow` tuples."""
    return encode_tail_index(encode_index_rows(rows), block_crcs, index_position=index_position)


def encode_tail_index(index: bytes, block_crcs: Sequence[int] | None, *, index_position: int) -> bytes:
    """:func:`encode_tail` of an index block already encoded (``INDEX_ENTRY`` after ``INDEX_ENTRY``)."""
    assert len(index) % INDEX_ENTRY_SIZE == 0
    if block_crcs is None:
        return index + encode_footer(Footer(index_position, len(index)))
    section = encode_checksum_section(crc32c(index), block_crcs)
    footer = Footer(index_position, len(index), len(section), crc32c(section))
    return index + section + encode_footer(footer)
