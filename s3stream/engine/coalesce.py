"""Coalescing of small plain appends: the appends submitted in one event-loop turn share ONE WAL record.

Every plain append below ``PARTS_MIN_BYTES`` joins the open coalesced record: its record header and
payload (``StreamRecordBatch.encode()``'s bytes once joined) are added to the record's parts and its
appender awaits the record's shared future. The record is submitted to the WAL at the end of the turn (one
``loop.call_soon``), or at once when it would grow past ``s3.wal.record.size.max``, or when any other
WAL record is about to be written (:meth:`AppendCoalescer.flush`: WAL offsets keep following
submission sequence numbers). Its body is an atomic group body with no KV puts
(``docs/format.md`` section 5): recovery and every WAL reader decode its batches one by one, as
they do any group's. The engine coalesces only over a WAL whose append submits in call order before
it returns (the block WAL's, a plain method returning a future): a coroutine WAL would start its
write only when its task runs, after records submitted later.

What this saves: the WAL's per-record work (a future, a record header and CRC, the group packing
bookkeeping) is paid once per turn instead of once per append; the appender keeps its own
per-append work (offsets, LogCache insert, acknowledgement), which runs in line as before.

Invariants:

- An append is acknowledged only after the shared future resolved with the record's WAL offset,
  i.e. once the whole record is durable (a record is durable whole or not at all).
- The record takes one submission sequence number when it opens; it is submitted before any record
  with a later one (``flush`` runs before every other WAL write), so sequence numbers still grow with
  WAL offsets.
- The node lease is checked once for the record right before it is submitted (``before_write``: a
  record past the deadline never reaches the WAL, and fails every appender of it). A record durable
  after the deadline is refused by each appender's own check in its turn (:mod:`s3stream.engine.append`),
  not here: the process may pause between the WAL's answer and an appender's wake-up.
  (The engine still checks an append that opens a record, or is not coalesced, before it takes its
  offsets; one that joins an open record is checked with the record.)
- The trim tracker sees the record as ONE write in flight (``write_started`` when it opens,
  ``write_returned`` when the WAL answers); each appender counts its own body bytes as live, and
  appenders of one record held behind an earlier append of their stream hold its seq once each.
- Cancelling one appender never cancels the shared future (the others still wait for it): the
  cancelled appender raises CancelledError once the write has completed, as a cancelled plain
  append does (it fences its stream).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from s3stream.engine.walbody import ATOMIC_GROUP_MAGIC, ATOMIC_GROUP_VERSION, GROUP_HEADER, GROUP_HEADER_SIZE
from s3stream.engine.walport import BodyParts
from s3stream.engine.waltrim import WalTrimTracker
from s3stream.errors import UnavailableError

_EMPTY = b""


class SharedWrite(asyncio.Future[int]):
    """The future every append of one coalesced record awaits: resolved with the record's WAL offset
    (or the WAL's error, untranslated). ``cancel`` refuses: an awaiting task that is cancelled gets
    its CancelledError once the write is done, and the other appenders keep waiting."""

    def cancel(self, msg: Any | None = None) -> bool:
        return False


class AppendCoalescer:
    """The open coalesced record of one engine (at most one at a time) and its submission."""

    __slots__ = (
        "_body_bytes",
        "_count",
        "_loop",
        "_next_seq",
        "_parts",
        "_record_max_bytes",
        "_trim_tracker",
        "_wal_append",
        "_write",
        "before_write",
        "open_seq",
        "record_count",
    )

    def __init__(
        self,
        *,
        wal_append: Callable[[BodyParts], Awaitable[int]],
        trim_tracker: WalTrimTracker,
        next_seq: Callable[[], int],
        record_max_bytes: int,
        before_write: Callable[[], BaseException | None] | None = None,
    ) -> None:
        self._wal_append = wal_append
        self._trim_tracker = trim_tracker
        self._next_seq = next_seq
        self._record_max_bytes = record_max_bytes
        self._loop: asyncio.AbstractEventLoop | None = None
        self._parts: list[bytes] | None = None
        """The open record's parts: a placeholder for the group header, then each batch's record
        header and payload."""
        self._write: SharedWrite | None = None
        self.open_seq = -1
        """The open record's sequence number (negative: no record is open)."""
        self._count = 0
        self._body_bytes = 0
        self.before_write = before_write
        """Called once right before a record is submitted: the error to fail its appenders with
        instead of writing it (the engine's lease check); None: write it."""
        self.record_count = 0
        """Coalesced records submitted so far."""

    def add(self, header: bytes, payload: bytes, size: int) -> tuple[int, SharedWrite]:
        """Add one plain batch, encoded as its record ``header`` and ``payload`` (``size`` bytes
        together), to the open record (opening one if none is); returns the record's sequence number
        and the future its appender awaits. No await: call it right where the append takes its offsets."""
        parts = self._parts
        if parts is not None and self._body_bytes + size > self._record_max_bytes:
            self.flush()
            parts = None
        if parts is None:
            loop = self._loop
            if loop is None:
                loop = self._loop = asyncio.get_running_loop()
            parts = self._parts = [_EMPTY]
            self._write = SharedWrite(loop=loop)
            self.open_seq = seq = self._next_seq()
            self._count = 0
            self._body_bytes = GROUP_HEADER_SIZE
            self._trim_tracker.write_started(seq)
            loop.call_soon(self.flush)
        parts.append(header)
        parts.append(payload)
        self._count += 1
        self._body_bytes += size
        write = self._write
        assert write is not None
        return self.open_seq, write

    def flush(self) -> None:
        """Submit the open record to the WAL now (nothing when none is open)."""
        parts = self._parts
        if parts is None:
            return
        write = self._write
        seq = self.open_seq
        assert write is not None
        self._parts = self._write = None
        self.open_seq = -1
        if self.before_write is not None:
            refused = self.before_write()
            if refused is not None:  # never written
                self._done(seq, write, None, refused)
                return
        parts[0] = GROUP_HEADER.pack(ATOMIC_GROUP_MAGIC, ATOMIC_GROUP_VERSION, 0, self._count, 0)
        self.record_count += 1
        try:
            wal_write = asyncio.ensure_future(self._wal_append(_EMPTY.join(parts)))
        except BaseException as exc:  # noqa: BLE001 - a refused submission fails every appender of it
            self._done(seq, write, None, exc)
            return
        wal_write.add_done_callback(lambda done: self._done(seq, write, done, None))

    def _done(
        self, seq: int, write: SharedWrite, done: asyncio.Future[int] | None, error: BaseException | None
    ) -> None:
        """The WAL answered for record ``seq``: one ``write_returned`` for it, then every appender."""
        offset = -1
        if done is not None:
            if done.cancelled():
                error = UnavailableError("the coalesced WAL write was cancelled")
            else:
                error = done.exception()
                if error is None:
                    offset = done.result()
        self._trim_tracker.write_returned(seq, offset)
        if error is not None:
            write.set_exception(error)
            write.exception()  # retrieved: every appender raises its own translation of it
        else:
            write.set_result(offset)
