"""The node's side of stream ownership: it follows the cluster's assignments and takeovers and acts on them.

One :class:`ClusterWatcher` per node polls the shared metadata every ``s3.cluster.poll.ms``
(:meth:`ClusterWatcher.poll_once`) and:

- **loses** a stream it holds open that an assignment row sends to another node: every later append
  raises MovedError naming the target, the appends in flight finish, the stream's data is forced up and
  it is closed in metadata (:meth:`~s3stream.engine.core.Engine.move_streams`, all streams of one target
  in one batch), then a "lost" event is published. A stream this node still holds OPENED in metadata
  without an open handle (a close that failed after its upload) is closed in metadata the same way.
- **gains** a stream an assignment row sends to this node once it is CLOSED: it is opened at its
  stored epoch + 1 (the open removes the row in the same transaction; all gains of one poll in one
  metadata transaction, :meth:`~s3stream.engine.core.Engine.open_streams`) and a "gained" event carries
  the open :class:`~s3stream.engine.client.Stream`.
- **takes over** a dead node when a RUNNING takeover names this session as taker: the
  :data:`TakeoverRunner` runs it (once per attempt at a time; a failed run is retried after
  :data:`RUNNER_RETRY_S`; after ``run_failures_max`` failed runs the attempt is given back to the
  controller, ``give_back_takeover``), and the streams it returns (taken over and closed) are opened here as gains,
  unless an assignment row sends one elsewhere or another node opened it first.
- on a **fence** of the node (:meth:`on_fenced`, a heartbeat listener): publishes "lost" for every
  stream open here and ends the subscriptions with the fence's error; it stops polling.

Every action runs in a task of its own, so a slow upload or takeover never delays the polls; a stream
is in at most one action at a time. Correctness rests on polling alone; the poll interval bounds the
time a row waits to be seen.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator, Sequence
from typing import Any, TypeVar

from s3stream.cluster.events import AssignmentEvent, AssignmentHub
from s3stream.engine.client import Stream
from s3stream.engine.core import NODE_FENCE_CODES, Engine, Status, StreamHandle
from s3stream.errors import FencedError, NotFoundError, S3StreamError
from s3stream.ids import StreamId
from s3stream.logfmt import log_event
from s3stream.metadata.base import (
    Assignment,
    MetadataStore,
    StreamMetadata,
    StreamState,
    TakeoverInfo,
    TakeoverState,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

TakeoverRunner = Callable[[TakeoverInfo], Awaitable[Sequence[StreamId]]]
"""Runs the takeover of a dead node assigned to this node's session (the taker's work, see
``s3stream.cluster.takeover``); returns the streams it took over and closed (this node opens them next)."""

DESCRIBES_MAX = 8
"""Stream reads of one gain in flight at once (they overlap on a multi-connection store)."""
GAINS_BATCH_MAX = 1000
"""Streams opened by one metadata transaction of a gain (``open_streams``)."""
RUNNER_RETRY_S = 1.0
"""Wait before a failed takeover run is started again (while the takeover still names this session)."""
RUN_FAILURES_MAX = 3
"""Failed runs of one takeover attempt after which this node gives the attempt back."""


async def no_takeover(takeover: TakeoverInfo) -> Sequence[StreamId]:
    """The default runner: takes nothing over (a node that is never a taker)."""
    log_event(log, logging.WARNING, "takeover.no_runner", node=takeover.node_id)
    return ()


class ClusterWatcher:
    """Polls assignments and takeovers for one node session and carries out its losses and gains.

    Invariant: a stream id is in ``_busy`` while exactly one action (move, gain, close) on it runs;
    no second action starts on it meanwhile."""

    def __init__(
        self,
        engine: Engine,
        metadata: MetadataStore,
        hub: AssignmentHub,
        *,
        poll_ms: int,
        takeover_runner: TakeoverRunner = no_takeover,
        clock: Callable[[], float] | None = None,
        run_failures_max: int = RUN_FAILURES_MAX,
    ) -> None:
        if run_failures_max <= 0:
            raise ValueError(f"run_failures_max must be positive, got {run_failures_max}")
        self.run_failures_max = run_failures_max
        self.engine = engine
        self.metadata = metadata
        self.hub = hub
        self.poll_ms = poll_ms
        self.takeover_runner = takeover_runner
        self._clock = clock or asyncio.get_running_loop().time
        self._busy: set[StreamId] = set()
        self._adopt: set[StreamId] = set()
        """Streams a takeover run here closed: opened here next unless a row sends them elsewhere."""
        self._runs: dict[int, asyncio.Task[None]] = {}
        """Dead node id -> its takeover run in progress here."""
        self._run_failed_at: dict[tuple[int, int, int], float] = {}
        self._run_failures: dict[tuple[int, int, int], int] = {}
        """(dead node id, its session's node epoch, attempt) -> failed runs of that attempt here."""
        self._run_done: set[tuple[int, int, int]] = set()
        """(dead node id, its session's node epoch, attempt) of the takeover runs that returned here
        (never run again). The epoch is part of the key: a later session of the same node that dies
        gets a takeover of its own, whose attempt counts from 1 again."""
        self.hub_closed = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._task: asyncio.Task[None] | None = None
        self._wakeup = asyncio.Event()
        self._stopped = False
        self.poll_count = 0
        self.poll_error: BaseException | None = None
        """The last poll's failure (None after a successful poll)."""

    @property
    def node_id(self) -> int:
        return self.engine.node_id

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None and not self._stopped:
            self._task = asyncio.create_task(self._loop(), name="s3stream-cluster-watcher")

    def wake(self) -> None:
        """Poll now instead of at the next interval (a notification arrived)."""
        self._wakeup.set()

    async def close(self) -> None:
        """Stop polling and taking over; let the moves and gains in flight finish (a move is the close
        the engine's own close would do; a gained stream is then closed by it), for at most
        ``s3.close.timeout.ms``, then cancel them."""
        self._stopped = True
        stopping = [t for t in (self._task, *self._runs.values()) if t is not None]
        for task in stopping:
            task.cancel()
        actions = list(self._tasks)
        if actions:
            _, late = await asyncio.wait(actions, timeout=self.engine.config.close_timeout_ms / 1000)
            for task in late:
                task.cancel()
            stopping += late
        for task in stopping:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._task = None

    def on_fenced(self, error: FencedError) -> None:
        """The node's session is lost: every stream open here is lost; subscriptions end with ``error``."""
        if self.hub_closed:
            return
        self._stopped = True
        for handle in list(self.engine.streams.values()):
            if handle.status is not Status.CLOSED:
                self.hub.publish(AssignmentEvent("lost", handle.stream_id))
        self.hub.close(error)
        self.hub_closed = True
        for task in (self._task, *self._tasks, *self._runs.values()):
            if task is not None:
                task.cancel()

    async def _loop(self) -> None:
        interval_s = self.poll_ms / 1000
        while not self._stopped:
            try:
                await self.poll_once()
                self.poll_error = None
            except FencedError as exc:
                if exc.code in NODE_FENCE_CODES:
                    self.on_fenced(exc)
                    return
                self.poll_error = exc
                log_event(log, logging.WARNING, "cluster.poll_failed", error=exc, action="retry")
            except Exception as exc:  # noqa: BLE001 - the task boundary: a poll that fails is retried
                self.poll_error = exc
                log_event(log, logging.WARNING, "cluster.poll_failed", error=repr(exc), action="retry")
            self._wakeup.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), interval_s)

    # -- one poll --------------------------------------------------------------------------------
    async def poll_once(self) -> None:
        """Read the assignments and takeovers once and start the actions they call for."""
        self.poll_count += 1
        if self.engine.fenced:
            return
        rows = await self.metadata.list_assignments()
        targeted: dict[StreamId, Assignment] = {row.stream_id: row for row in rows}
        moves: dict[int, list[StreamHandle]] = {}
        gains: list[StreamId] = []
        strays: list[StreamId] = []
        settles: list[StreamId] = []
        for row in rows:
            sid = row.stream_id
            if sid in self._busy:
                continue
            handle = self.engine.streams.get(sid)
            if row.to_node_id != self.node_id:
                self._adopt.discard(sid)
                if handle is not None and (
                    handle.status is Status.OPEN
                    or (handle.status is Status.CLOSING and handle.close_timed_out)
                ):
                    moves.setdefault(row.to_node_id, []).append(handle)
                elif handle is None and row.from_node_id == self.node_id:
                    strays.append(sid)
            elif handle is None:
                gains.append(sid)
            elif handle.status is Status.OPEN and handle.moved_to is None:
                settles.append(sid)  # sent back here before this node let it go
        for sid in list(self._adopt):
            if sid not in targeted and sid not in self._busy and sid not in self.engine.streams:
                gains.append(sid)
        for to_node_id, handles in moves.items():
            self._spawn(self._move(handles, to_node_id), [h.stream_id for h in handles])
        if strays:
            self._spawn(self._close_strays(strays), strays)
        if gains:
            self._spawn(self._gain(gains), gains)
        if settles:
            self._spawn(self._settle(settles), settles)
        await self._poll_takeovers()

    def _spawn(self, coro: Coroutine[Any, Any, None], stream_ids: Iterable[StreamId]) -> None:
        ids = list(stream_ids)
        self._busy.update(ids)

        async def run() -> None:
            try:
                await coro
            except asyncio.CancelledError:
                raise
            except FencedError as exc:
                if exc.code in NODE_FENCE_CODES:
                    self.on_fenced(exc)
                else:
                    log_event(log, logging.WARNING, "cluster.action_refused", streams=ids, error=exc)
            except (S3StreamError, OSError) as exc:
                log_event(
                    log,
                    logging.WARNING,
                    "cluster.action_failed",
                    streams=ids,
                    error=exc,
                    action="retried on a later poll",
                )
            finally:
                self._busy.difference_update(ids)

        task = asyncio.create_task(run(), name="s3stream-cluster-action")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- actions ---------------------------------------------------------------------------------
    async def _move(self, handles: list[StreamHandle], to_node_id: int) -> None:
        gone = await self.engine.move_streams(handles, to_node_id)
        for handle in gone:
            log_event(log, logging.INFO, "stream.moved", stream=handle.stream_id, to_node=to_node_id)
            self.hub.publish(AssignmentEvent("lost", handle.stream_id))

    async def _settle(self, stream_ids: list[StreamId]) -> None:
        """Rows sending streams this node holds open (and never started moving) back to it: removed."""
        for sid in stream_ids:
            await self.metadata.settle_assignment(
                stream_id=sid, node_id=self.engine.node_id, node_epoch=self.engine.node_epoch
            )

    async def _close_strays(self, stream_ids: list[StreamId]) -> None:
        """Streams reassigned away that this node still holds OPENED in metadata with no open handle
        (a close whose upload went through but whose metadata close failed): close them now."""
        for sid in stream_ids:
            try:
                meta = await self.metadata.describe_stream(sid)
            except NotFoundError:
                continue
            last = meta.ranges[-1] if meta.ranges else None
            if meta.state is not StreamState.OPENED or last is None or last.node_id != self.node_id:
                continue
            if sid in self.engine.streams:
                continue
            await self.engine.force_upload(sid)
            await self.metadata.close_stream(
                node_id=self.engine.node_id,
                node_epoch=self.engine.node_epoch,
                stream_id=sid,
                epoch=meta.epoch,
            )
            self.hub.publish(AssignmentEvent("lost", sid))

    async def _gain(self, stream_ids: list[StreamId]) -> None:
        """Open the streams that are CLOSED now, each at its stored epoch + 1, in one metadata
        transaction (``Engine.open_streams``); the others wait for a later poll."""
        slots = asyncio.Semaphore(DESCRIBES_MAX)

        async def describe(sid: StreamId) -> StreamMetadata | None:
            async with slots:
                try:
                    return await self.metadata.describe_stream(sid)
                except NotFoundError:
                    return None

        metas = await asyncio.gather(*(describe(sid) for sid in stream_ids))
        requests: list[tuple[StreamId, int]] = []
        for sid, meta in zip(stream_ids, metas, strict=True):
            if meta is None:
                self._adopt.discard(sid)
                continue
            if meta.state is not StreamState.CLOSED:
                if sid in self._adopt and meta.ranges and meta.ranges[-1].node_id != self.node_id:
                    self._adopt.discard(sid)  # another node opened it first
                continue
            if sid in self.engine.streams:
                continue
            requests.append((sid, meta.epoch + 1))
        for chunk in _chunks(requests, GAINS_BATCH_MAX):
            for sid, result in await self.engine.open_streams(chunk):
                if isinstance(result, FencedError) and result.code in NODE_FENCE_CODES:
                    raise result
                if isinstance(result, S3StreamError):
                    # NotOwnerError, a stream fence, a race with another open: a later poll decides
                    log_event(log, logging.INFO, "stream.gain_deferred", stream=sid, reason=result)
                    continue
                self._adopt.discard(sid)
                log_event(log, logging.INFO, "stream.gained", stream=sid, epoch=result.epoch)
                self.hub.publish(AssignmentEvent("gained", sid, Stream(self.engine, result)))

    async def _poll_takeovers(self) -> None:
        for takeover in await self.metadata.list_takeovers():
            if (
                takeover.state is not TakeoverState.RUNNING
                or takeover.taker_node_id != self.node_id
                or takeover.taker_node_epoch != self.engine.node_epoch
            ):
                continue
            run = self._runs.get(takeover.node_id)
            key = _run_key(takeover)
            if (run is not None and not run.done()) or key in self._run_done:
                continue
            failed_at = self._run_failed_at.get(key)
            if failed_at is not None and self._clock() - failed_at < RUNNER_RETRY_S:
                continue
            task = asyncio.create_task(self._run_takeover(takeover), name="s3stream-cluster-takeover")
            self._runs[takeover.node_id] = task

    async def _run_takeover(self, takeover: TakeoverInfo) -> None:
        try:
            taken = await self.takeover_runner(takeover)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a task boundary: the takeover stays RUNNING, run again
            key = _run_key(takeover)
            self._run_failed_at[key] = self._clock()
            failures = self._run_failures[key] = self._run_failures.get(key, 0) + 1
            if failures < self.run_failures_max:
                log_event(log, logging.WARNING, "takeover.failed", node=takeover.node_id, attempt=takeover.attempt, failures=failures, error=repr(exc), action="retry")  # fmt: skip
                return
            log_event(log, logging.ERROR, "takeover.given_back", node=takeover.node_id, attempt=takeover.attempt, failures=failures, error=repr(exc))  # fmt: skip
            self._run_done.add(key)
            try:
                await self.metadata.give_back_takeover(
                    node_id=takeover.node_id,
                    taker_node_id=self.engine.node_id,
                    taker_node_epoch=self.engine.node_epoch,
                )
            except S3StreamError as give_back_error:  # the controller re-assigned it meanwhile
                log_event(
                    log,
                    logging.WARNING,
                    "takeover.give_back_refused",
                    node=takeover.node_id,
                    error=give_back_error,
                )
            return
        self._run_done.add(_run_key(takeover))
        self._adopt.update(taken)
        if taken:
            self.wake()


def _chunks(items: list[T], size: int) -> Iterator[list[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _run_key(takeover: TakeoverInfo) -> tuple[int, int, int]:
    """One takeover attempt: the dead session (node id, node epoch) and the attempt number."""
    return (int(takeover.node_id), takeover.node_epoch, takeover.attempt)
