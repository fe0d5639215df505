"""The object format's layouts and values: one ``struct.Struct`` per structure, the decoded values
(index entry, footer, checksum section, object tail) and the object's size arithmetic.

Layout: ``docs/format.md`` section 2 (AutoMQ's data block, index block and footer byte for byte, plus
our checksum section between the index block and the footer, found through the footer's reserved
bytes). The sans-IO codecs on these layouts are :mod:`s3stream.objectformat.block` (data blocks) and
:mod:`s3stream.objectformat.tail` (index block, checksum section, footer); every decoder returns a
value or raises :class:`~s3stream.errors.CorruptionError` naming the source and the byte position of
the structure that failed; nothing else escapes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from crc32c import crc32c

from s3stream.errors import CorruptionError
from s3stream.record import RECORD_HEADER_SIZE

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
