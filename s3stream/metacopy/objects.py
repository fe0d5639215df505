"""The copy's objects: their keys, and the framing of log objects and snapshots (``docs/format.md`` 6.1).

Keys: ``<namespace>/metadata-copy/<copy id>/log/<first seq>-<last seq>`` and
``<namespace>/metadata-copy/<copy id>/snapshot/<seq>``, sequence numbers as 20 decimal digits so key
order is sequence order. Five segments: never an object key (``parse_object_key`` takes three), so
the orphan scan and the storage binding's check leave them alone.

A log object is a header and the groups ``first..last`` (each its sequence number, its length and
the group bytes of :mod:`~s3stream.metadata.changelog`, which carry their own CRC). A snapshot is a
header and a SQLite database file. Decoders return values or raise
:class:`~s3stream.errors.CorruptionError` naming the key.
"""

from __future__ import annotations

import itertools
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from crc32c import crc32c

from s3stream.errors import CorruptionError, InvalidArgumentError

COPY_DIR = "metadata-copy"
SEQ_DIGITS = 20
_SEQ = r"\d{20}"
_COPY_ID = re.compile(r"[0-9a-f]{16}")

LOG_MAGIC = 0x53334D4C  # "S3ML"
SNAPSHOT_MAGIC = 0x53334D53  # "S3MS"
COPY_OBJECT_VERSION = 1
LOG_HEADER = struct.Struct(
    ">"
    "I"  # magic, 0x53334D4C ("S3ML")
    "H"  # version, 1
    "H"  # reserved, 0
    "Q"  # first seq: the first group's sequence number
    "Q"  # last seq: the last group's; the groups are first..last, each once, in order
    "I"  # CRC32C of the header's first 20 bytes, then every byte after the header
)
LOG_HEADER_SIZE = LOG_HEADER.size
LOG_ENTRY = struct.Struct(
    ">"
    "Q"  # seq of the group
    "I"  # group length in bytes (the group follows)
)
LOG_ENTRY_SIZE = LOG_ENTRY.size
SNAPSHOT_HEADER = struct.Struct(
    ">"
    "I"  # magic, 0x53334D53 ("S3MS")
    "H"  # version, 1
    "H"  # reserved, 0
    "Q"  # seq: the last group the database holds
    "Q"  # database length in bytes (the SQLite file follows)
    "I"  # CRC32C of the header's first 24 bytes, then the database
)
SNAPSHOT_HEADER_SIZE = SNAPSHOT_HEADER.size


def copies_prefix(namespace: str) -> str:
    """Where every copy of ``namespace`` lives (one sub-folder per copy id)."""
    return f"{namespace}/{COPY_DIR}/"


def copy_prefix(namespace: str, copy_id: str) -> str:
    if not _COPY_ID.fullmatch(copy_id):
        raise InvalidArgumentError(f"a copy id is 16 lowercase hex digits, got {copy_id!r:.40}")
    return f"{copies_prefix(namespace)}{copy_id}/"


def log_key(prefix: str, first_seq: int, last_seq: int) -> str:
    assert 0 < first_seq <= last_seq
    return f"{prefix}log/{first_seq:0{SEQ_DIGITS}d}-{last_seq:0{SEQ_DIGITS}d}"


def snapshot_key(prefix: str, seq: int) -> str:
    assert seq >= 0
    return f"{prefix}snapshot/{seq:0{SEQ_DIGITS}d}"


@dataclass(frozen=True, slots=True)
class CopyKey:
    """A parsed key of a copy's object."""

    copy_id: str
    kind: str
    """``"log"`` or ``"snapshot"``."""
    first_seq: int
    last_seq: int
    """Equal to ``first_seq`` for a snapshot."""


_KEY = re.compile(
    rf"(?P<copy>[0-9a-f]{{16}})/(?:log/(?P<first>{_SEQ})-(?P<last>{_SEQ})|snapshot/(?P<snap>{_SEQ}))"
)


def parse_copy_key(namespace: str, key: str) -> CopyKey | None:
    """The parsed ``key``, or None for a key that is not one of the copy's objects."""
    base = copies_prefix(namespace)
    if not key.startswith(base):
        return None
    match = _KEY.fullmatch(key[len(base) :])
    if match is None:
        return None
    if match["snap"] is not None:
        seq = int(match["snap"])
        return CopyKey(match["copy"], "snapshot", seq, seq)
    first, last = int(match["first"]), int(match["last"])
    if not 0 < first <= last:
        return None
    return CopyKey(match["copy"], "log", first, last)


def encode_log(groups: Sequence[tuple[int, bytes]]) -> bytes:
    """A log object holding ``groups`` ((seq, group bytes), consecutive sequence numbers)."""
    assert groups
    assert all(b[0] == a[0] + 1 for a, b in itertools.pairwise(groups))
    parts: list[bytes] = []
    for seq, payload in groups:
        parts.append(LOG_ENTRY.pack(seq, len(payload)))
        parts.append(payload)
    body = b"".join(parts)
    head = LOG_HEADER.pack(LOG_MAGIC, COPY_OBJECT_VERSION, 0, groups[0][0], groups[-1][0], 0)[:-4]
    return head + struct.pack(">I", crc32c(body, crc32c(head))) + body


def decode_log(data: bytes, *, source: str) -> list[tuple[int, memoryview]]:
    """The (seq, group bytes) of a log object, in order."""
    view = memoryview(data)
    if len(view) < LOG_HEADER_SIZE:
        raise CorruptionError(f"log object of {len(view)} bytes has no header", source=source, position=0)
    magic, version, reserved, first, last, crc = LOG_HEADER.unpack_from(view)
    if magic != LOG_MAGIC:
        raise CorruptionError(f"not a log object (magic {magic:#x})", source=source, position=0)
    if crc32c(view[LOG_HEADER_SIZE:], crc32c(view[: LOG_HEADER_SIZE - 4])) != crc:
        raise CorruptionError("log object CRC32C mismatch", source=source, position=0)
    if version != COPY_OBJECT_VERSION or reserved:
        raise CorruptionError(f"unknown log object version {version}", source=source, position=4)
    groups: list[tuple[int, memoryview]] = []
    pos, expected = LOG_HEADER_SIZE, first
    while pos < len(view):
        if len(view) - pos < LOG_ENTRY_SIZE:
            raise CorruptionError("log object ends inside an entry", source=source, position=pos)
        seq, length = LOG_ENTRY.unpack_from(view, pos)
        if seq != expected or seq > last:
            raise CorruptionError(
                f"log entry has seq {seq}, expected {expected}", source=source, position=pos
            )
        start = pos + LOG_ENTRY_SIZE
        if length > len(view) - start:
            raise CorruptionError("log entry runs past the object's end", source=source, position=pos)
        groups.append((seq, view[start : start + length]))
        pos, expected = start + length, expected + 1
    if expected != last + 1:
        raise CorruptionError(
            f"log object ends at seq {expected - 1}, its header says {last}", source=source, position=pos
        )
    return groups


def encode_snapshot(seq: int, database: bytes) -> bytes:
    head = SNAPSHOT_HEADER.pack(SNAPSHOT_MAGIC, COPY_OBJECT_VERSION, 0, seq, len(database), 0)[:-4]
    return head + struct.pack(">I", crc32c(database, crc32c(head))) + database


def decode_snapshot(data: bytes, *, source: str) -> tuple[int, memoryview]:
    """(the last group the database holds, the SQLite database file's bytes)."""
    view = memoryview(data)
    if len(view) < SNAPSHOT_HEADER_SIZE:
        raise CorruptionError(f"snapshot of {len(view)} bytes has no header", source=source, position=0)
    magic, version, reserved, seq, length, crc = SNAPSHOT_HEADER.unpack_from(view)
    if magic != SNAPSHOT_MAGIC:
        raise CorruptionError(f"not a snapshot (magic {magic:#x})", source=source, position=0)
    if crc32c(view[SNAPSHOT_HEADER_SIZE:], crc32c(view[: SNAPSHOT_HEADER_SIZE - 4])) != crc:
        raise CorruptionError("snapshot CRC32C mismatch", source=source, position=0)
    if version != COPY_OBJECT_VERSION or reserved:
        raise CorruptionError(f"unknown snapshot version {version}", source=source, position=4)
    if length != len(view) - SNAPSHOT_HEADER_SIZE:
        raise CorruptionError("snapshot length does not match its header", source=source, position=16)
    return seq, view[SNAPSHOT_HEADER_SIZE:]
