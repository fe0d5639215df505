"""The synthetic producer of ``s3stream serve --produce``: paced appends to each stream a node owns.

One :class:`SyntheticProducer` per node. :meth:`SyntheticProducer.follow` starts appending to a stream
the node gained, :meth:`SyntheticProducer.drop` stops it when the node lost it. Each stream gets
``rate_per_s`` records per second (generated payloads, :func:`s3stream.cli.produce.generated_payload`,
each naming the offset it is meant for), at most :data:`INFLIGHT_MAX` appends awaited at once per
stream.

How an append ends decides what happens next, once, by the first failure of a stream:

* acknowledged: counted (records and bytes, for the rate line);
* :class:`~s3stream.errors.NotOwnerError` (including ``MovedError``), :class:`~s3stream.errors.ClosedError`
  or a stream-level :class:`~s3stream.errors.FencedError`: the stream went elsewhere; its appends stop
  and the node keeps serving;
* a node-level ``FencedError`` (``NODE_FENCED``, ``NODE_EPOCH_EXPIRED``): the node's session is lost;
  :attr:`SyntheticProducer.node_fenced` holds the error and every stream stops (the command exits
  non-zero);
* anything else: kept in :attr:`SyntheticProducer.failure`, every stream stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from s3stream.cli.produce import generated_payload
from s3stream.engine.client import Stream
from s3stream.errors import ClosedError, ErrorCode, FencedError, NotOwnerError
from s3stream.model import RecordBatch

INFLIGHT_MAX = 64
"""Appends awaited at once per stream (their offsets are assigned in call order, so order holds)."""
TICK_S = 0.02
"""How often a stream's pacing loop issues the appends that are due."""
NODE_FENCE_CODES = frozenset({ErrorCode.NODE_FENCED, ErrorCode.NODE_EPOCH_EXPIRED})


@dataclass
class Tally:
    """Acknowledged appends: since the start and since the last rate line."""

    records: int = 0
    bytes: int = 0
    window_records: int = 0
    window_started_s: float = field(default_factory=time.monotonic)

    def add(self, size_bytes: int) -> None:
        self.records += 1
        self.bytes += size_bytes
        self.window_records += 1

    def take_rate(self) -> tuple[float, float]:
        """(records/s since the last call, seconds it covers); starts a new window."""
        now = time.monotonic()
        elapsed_s = max(now - self.window_started_s, 1e-9)
        rate = self.window_records / elapsed_s
        self.window_records = 0
        self.window_started_s = now
        return rate, elapsed_s


Notice = Callable[[str], None]
"""Where the producer reports a stream it stopped appending to (one line, no newline)."""


class SyntheticProducer:
    """Paced appends to the streams a node owns (see the module docstring)."""

    def __init__(self, *, rate_per_s: float, size_bytes: int, notice: Notice) -> None:
        if rate_per_s <= 0:
            raise ValueError(f"rate_per_s must be positive, got {rate_per_s}")
        self.rate_per_s = rate_per_s
        self.size_bytes = size_bytes
        self.notice = notice
        self.tally = Tally()
        self.node_fenced: FencedError | None = None
        self.failure: BaseException | None = None
        self.stopped = asyncio.Event()
        """Set once the node is fenced or an unexpected failure stopped every stream."""
        self._tasks: dict[int, asyncio.Task[None]] = {}

    @property
    def streams(self) -> list[int]:
        return sorted(stream_id for stream_id, task in self._tasks.items() if not task.done())

    def follow(self, stream: Stream) -> None:
        """Start appending to ``stream`` (a stream the node just gained)."""
        self.drop(stream.stream_id)
        self._tasks[stream.stream_id] = asyncio.create_task(
            self._pace(stream), name=f"produce-stream-{stream.stream_id}"
        )

    def drop(self, stream_id: int) -> None:
        """Stop appending to ``stream_id`` (lost): no new append; those in flight end on their own."""
        task = self._tasks.pop(stream_id, None)
        if task is not None:
            task.cancel()

    async def close(self) -> None:
        """Cancel every stream's loop and wait for them."""
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _pace(self, stream: Stream) -> None:
        started_s = time.monotonic()
        issued = 0
        base = stream.next_offset
        inflight: set[asyncio.Task[None]] = set()
        stopped: list[BaseException] = []

        def done(task: asyncio.Task[None]) -> None:
            inflight.discard(task)
            if not task.cancelled() and task.exception() is not None and not stopped:
                stopped.append(task.exception())  # type: ignore[arg-type]

        try:
            while not stopped:
                due = int((time.monotonic() - started_s) * self.rate_per_s) - issued
                room = INFLIGHT_MAX - len(inflight)
                for _ in range(max(0, min(due, room))):
                    payload = generated_payload(stream.stream_id, base + issued, self.size_bytes)
                    task = asyncio.create_task(self._append_one(stream, payload))
                    inflight.add(task)
                    task.add_done_callback(done)
                    issued += 1
                await asyncio.sleep(TICK_S)
        except asyncio.CancelledError:
            # Lost or shutting down: appends in flight finish (the engine decides their fate).
            if inflight:
                await asyncio.wait(inflight)
            raise
        self._stopped(stream.stream_id, stopped[0])

    async def _append_one(self, stream: Stream, payload: bytes) -> None:
        await stream.append(RecordBatch(payload))
        self.tally.add(len(payload))

    def _stopped(self, stream_id: int, error: BaseException) -> None:
        self._tasks.pop(stream_id, None)
        if is_node_fence(error):
            assert isinstance(error, FencedError)
            if self.node_fenced is None:
                self.node_fenced = error
            self.stopped.set()
            return
        if isinstance(error, NotOwnerError):
            self.notice(f"stream {stream_id}: appends stopped, owner is now node {error.owner_node_id}")
            return
        if isinstance(error, ClosedError | FencedError):
            self.notice(f"stream {stream_id}: appends stopped ({type(error).__name__}: {error})")
            return
        if self.failure is None:
            self.failure = error
        self.stopped.set()


def is_node_fence(error: BaseException) -> bool:
    """True for an error saying the node's own session is lost (not just one stream's epoch)."""
    return isinstance(error, FencedError) and error.code in NODE_FENCE_CODES
