"""Reading a WAL file without its owner: a read-only device for the recovery scanner, and its header.

Used by whoever reads a WAL that another process may own or may have left: the CLI's read-only view
(the owner may be running: no lock is taken) and a taker reading a dead node's WAL. Nothing here
writes: the device refuses the scanner's writes and syncs.
"""

from __future__ import annotations

import os

from wal.errors import WalStateError
from wal.format import WAL_HEADER_SIZE, WalHeader, decode_wal_header

HEADER_PROBE_BYTES = 2 * 65536
"""Bytes read from the file's start to find both header slots (the largest block size, twice)."""
BLOCK_BYTES_DEFAULT = 4096
"""Where the second header slot is looked for when the first one is not valid."""


class ReadOnlyFile:
    """The recovery scanner's device over a file opened ``O_RDONLY`` (no lock)."""

    mode = "read-only"

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_RDONLY)
        self.size_bytes = os.fstat(self._fd).st_size

    def read_into(self, pos: int, buf: memoryview) -> int:
        return os.preadv(self._fd, [buf], pos)

    def write(self, pos: int, data: object) -> None:
        raise WalStateError("the WAL is open read-only")

    def sync(self) -> None:
        raise WalStateError("the WAL is open read-only")

    def close(self) -> None:
        os.close(self._fd)


def newest_header(head: bytes) -> WalHeader | None:
    """The valid header slot with the highest sequence among the two at the start of ``head``."""
    first = decode_wal_header(head[:WAL_HEADER_SIZE])
    block = first.block_size if first is not None else BLOCK_BYTES_DEFAULT
    second = decode_wal_header(head[block : block + WAL_HEADER_SIZE]) if len(head) >= block * 2 else None
    valid = [h for h in (first, second) if h is not None]
    return max(valid, key=lambda h: h.seq) if valid else None
