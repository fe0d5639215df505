"""Engine-side state of one open stream: its epoch, offsets, status and queue of unacknowledged appends.

Offsets follow ``[start_offset, confirm_offset)`` for readable data and ``next_offset`` for the next
append; ``confirm_offset`` only moves when the ack sequencer (:mod:`s3stream.engine.sequencer`)
releases a persisted append in order.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field

from s3stream.engine.logcache import CachedBatch
from s3stream.errors import ClosedError, ConflictError, FencedError, S3StreamError
from s3stream.ids import StreamId


class Status(enum.Enum):
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"
    FENCED = "fenced"
    RESERVED = "reserved"
    """Held for an external commit (:mod:`s3stream.engine.external`): readable, no appends."""


class PendingAppend:
    """One WAL record (plain append or atomic group) waiting for its turn in its streams.

    Its outcome is ``acked`` or ``error``. ``future`` exists only while the appender waits for an
    earlier append of one of its streams. A plain append released as soon as it is durable (the
    usual case) has none of this: the sequencer builds one only for a plain append that must wait
    (it keeps its batch in ``item`` and has no ``by_stream`` dict) and for every atomic group
    (``by_stream``; ``remaining`` counts the streams whose confirm offset it has not reached yet).
    """

    __slots__ = ("acked", "by_stream", "error", "future", "item", "persisted", "remaining", "seq")

    def __init__(
        self,
        seq: int,
        by_stream: dict[StreamHandle, list[CachedBatch]] | None,
        remaining: int,
        item: CachedBatch | None = None,
    ) -> None:
        self.seq = seq
        self.by_stream = by_stream
        """A group's batches of each stream it touches, in offset order (None: a plain append)."""
        self.item = item
        """A plain append's batch (None: a group)."""
        self.remaining = remaining
        """A group's streams whose confirm offset it has not reached yet (released at 0)."""
        self.persisted = False
        self.acked = remaining == 0
        self.error: S3StreamError | None = None
        self.future: asyncio.Future[None] | None = None

    def fail(self, error: S3StreamError) -> None:
        """Fail the append unless it is already decided (its appender raises ``error``)."""
        if self.acked or self.error is not None:
            return
        self.error = error
        future = self.future
        if future is not None and not future.done():
            future.set_exception(error)
            future.exception()  # retrieved: its appender may have failed on its own

    def wait(self) -> asyncio.Future[None] | None:
        """A future resolved with the outcome (None: already decided)."""
        if self.acked or self.error is not None:
            return None
        if self.future is None:
            self.future = asyncio.get_running_loop().create_future()
        return self.future

    async def outcome(self) -> None:
        """Return once acknowledged; raise the error it failed with."""
        if self.acked:
            return
        if self.error is not None:
            raise self.error
        future = self.wait()
        assert future is not None
        await future


@dataclass(eq=False, slots=True)
class StreamHandle:
    """Engine-side state of one open stream."""

    stream_id: StreamId
    epoch: int
    start_offset: int
    next_offset: int
    confirm_offset: int
    status: Status = Status.OPEN
    error: S3StreamError | None = None
    waiting: dict[int, PendingAppend] = field(default_factory=dict)
    """base offset -> durable appends waiting for an earlier one still in flight (the sequencer's)."""
    close_timed_out: bool = False
    """A close gave up waiting for the stream's upload (it stays closing until a close gets through)."""
    append_failure: S3StreamError | None = None
    """Set once the stream's unacknowledged appends fail: those still in flight fail with it when
    they complete (:func:`s3stream.engine.sequencer.fail_stream`)."""
    reservation: str = ""
    """While RESERVED: what holds the stream (named in the ConflictError of a refused append)."""

    def check_writable(self) -> None:
        if self.status is Status.FENCED:
            raise self.error or FencedError(f"stream {self.stream_id} is fenced")
        if self.status is Status.RESERVED:
            raise ConflictError(
                f"stream {self.stream_id} is reserved by {self.reservation}: no appends until it is released"
            )
        if self.status is not Status.OPEN:
            raise ClosedError(f"stream {self.stream_id} is {self.status.value}")

    def check_readable(self) -> None:
        if self.status is Status.FENCED:
            raise self.error or FencedError(f"stream {self.stream_id} is fenced")
        if self.status is Status.CLOSED:
            raise ClosedError(f"stream {self.stream_id} is closed")

    def fence(self, error: S3StreamError) -> None:
        """Refuse later appends and reads with ``error`` (an open, reserved or closing stream only)."""
        if self.status is Status.OPEN or self.status is Status.CLOSING or self.status is Status.RESERVED:
            self.status = Status.FENCED
            self.error = error
