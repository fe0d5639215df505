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

from dataclasses import dataclass

from s3stream.errors import ConflictError, CorruptionError, UnavailableError
from wal.errors import WalCorruptionError
from wal.readonly import HEADER_PROBE_BYTES, ReadOnlyFile, newest_header
from wal.recovery import Layout, Scanner


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


def read_dead_wal(path: str, *, node_id: int) -> DeadWal:
    """The untrimmed records of the WAL file at ``path``, which must be node ``node_id``'s (blocking:
    run it in a thread). Writes nothing."""
    try:
        device = ReadOnlyFile(path)
    except OSError as exc:
        raise UnavailableError(f"cannot open node {node_id}'s WAL {path!r} read-only: {exc}") from exc
    try:
        head = bytearray(HEADER_PROBE_BYTES)
        got = device.read_into(0, memoryview(head))
        header = newest_header(bytes(head[:got]))
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
