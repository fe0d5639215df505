"""Reading another node's block WAL without writing a byte of it (the taker's side of a failover).

The dead node may come back (a SIGSTOPped process resumed, a machine rebooted) and must then find its
WAL exactly as it left it, so the taker never opens the WAL through :class:`wal.BlockWAL` (whose
recovery writes a padding record over a torn tail and a new header). It opens the file ``O_RDONLY``,
takes no lock, reads the newer of the two header slots and walks the records with the WAL's own
recovery scanner (:class:`wal.recovery.Scanner`: the same end-of-log rule, torn tails included), from
the trim offset on. The result is what the dead node's own recovery would replay: the untrimmed
``(offset, body)`` records in offset order.

Errors: a missing or unreadable file is :class:`~s3stream.errors.UnavailableError` (the attach may not
have made it reachable yet: the attempt is retried); no valid header, damage the recovery rule calls
corruption, or a WAL whose header names another node is :class:`~s3stream.errors.CorruptionError` /
:class:`~s3stream.errors.ConflictError` (a wrong or damaged volume: never replayed as if it were the
dead node's).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from s3stream.errors import ConflictError, CorruptionError, InvalidArgumentError, UnavailableError
from wal.errors import WalCorruptionError
from wal.format import WAL_HEADER_SIZE, WalHeader, decode_wal_header
from wal.recovery import Layout, Scanner

HEADER_PROBE_BYTES = 2 * 65536
"""Bytes read from the start of the file to find both header slots (two blocks of at most 64 KiB)."""
WAL_BLOCK_BYTES_DEFAULT = 4096
"""Where the second header slot is looked for when the first one is not valid."""


@dataclass(frozen=True, slots=True)
class DeadWal:
    """The untrimmed records of a WAL read read-only."""

    path: str
    node_id: int
    """The node the WAL's header names."""
    node_epoch: int
    """The node epoch in the WAL's header (at most the session that last opened it)."""
    records: tuple[tuple[int, bytes], ...]
    """``(offset, body)`` of every record from the trim offset on, in offset order."""


class _ReadOnlyDevice:
    """The scanner's device over a file opened ``O_RDONLY`` (its writes are refused)."""

    mode = "read-only"

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_RDONLY)
        self.size_bytes = os.fstat(self._fd).st_size

    def read_into(self, pos: int, buf: memoryview) -> int:
        return os.preadv(self._fd, [buf], pos)

    def write(self, pos: int, data: object) -> None:
        raise InvalidArgumentError("a dead node's WAL is read-only")

    def sync(self) -> None:
        raise InvalidArgumentError("a dead node's WAL is read-only")

    def close(self) -> None:
        os.close(self._fd)


def _newest_header(head: bytes) -> WalHeader | None:
    first = decode_wal_header(head[:WAL_HEADER_SIZE])
    block = first.block_size if first is not None else WAL_BLOCK_BYTES_DEFAULT
    second = decode_wal_header(head[block : block + WAL_HEADER_SIZE]) if len(head) >= block * 2 else None
    valid = [h for h in (first, second) if h is not None]
    return max(valid, key=lambda h: h.seq) if valid else None


def read_dead_wal(path: str, *, node_id: int) -> DeadWal:
    """The untrimmed records of the WAL file at ``path``, which must be node ``node_id``'s (blocking:
    run it in a thread). Writes nothing."""
    try:
        device = _ReadOnlyDevice(path)
    except OSError as exc:
        raise UnavailableError(f"cannot open node {node_id}'s WAL {path!r} read-only: {exc}") from exc
    try:
        head = bytearray(HEADER_PROBE_BYTES)
        got = device.read_into(0, memoryview(head))
        header = _newest_header(bytes(head[:got]))
        if header is None:
            raise CorruptionError(f"no valid WAL header: not node {node_id}'s WAL", source=path, position=0)
        if header.node_id != node_id:
            raise ConflictError(
                f"the WAL at {path!r} belongs to node {header.node_id}, not to node {node_id}: wrong volume"
            )
        scanner = Scanner(device, Layout(header.block_size, header.capacity), header)
        records: list[tuple[int, bytes]] = []
        try:
            while not scanner.done:
                records.extend((rec.offset, rec.data) for rec in scanner.next_batch())
        except WalCorruptionError as exc:
            raise CorruptionError(str(exc), source=path, position=exc.position) from exc
        finally:
            scanner.reader.close()
    except OSError as exc:
        raise UnavailableError(f"reading node {node_id}'s WAL {path!r} failed: {exc}") from exc
    finally:
        device.close()
    return DeadWal(path, header.node_id, header.node_epoch, tuple(records))
