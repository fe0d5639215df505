"""The object tail codec: index block, checksum section and footer, encoded together and decoded
and verified from an object's last bytes.

Layout: ``docs/format.md`` section 2 (the structs in :mod:`s3stream.objectformat.codec`). Sans-IO:
bytes in, values out; a decoder returns a value (or :class:`~s3stream.objectformat.codec.NeedBytes`)
or raises :class:`~s3stream.errors.CorruptionError` naming the source and the byte position.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence

from crc32c import crc32c

from s3stream.errors import CorruptionError
from s3stream.objectformat.codec import (
    CHECKSUM_SECTION_HEADER,
    CHECKSUM_SECTION_HEADER_SIZE,
    CHECKSUM_SECTION_MAGIC,
    CHECKSUM_SECTION_VERSION,
    DATA_BLOCK_HEADER_SIZE,
    FOOTER,
    FOOTER_CRC_OFFSET,
    FOOTER_EXTENSION_MAGIC,
    FOOTER_EXTENSION_VERSION,
    FOOTER_MAGIC,
    FOOTER_MAGIC_OFFSET,
    FOOTER_RESERVED_OFFSET,
    FOOTER_SIZE,
    FOOTER_ZERO_OFFSET,
    I64_MAX,
    INDEX_ENTRY,
    INDEX_ENTRY_SIZE,
    ChecksumSection,
    Footer,
    IndexEntry,
    NeedBytes,
    ObjectTail,
    checksum_section_size,
    verify_crc,
)
from s3stream.record import RECORD_HEADER_SIZE

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
