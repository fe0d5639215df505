"""The failover controller: the one node that notices dead nodes, fences them and assigns their WALs.

:class:`FailoverController` is a job of an election on the lease :data:`CONTROLLER_LEASE` (the same
:class:`~compaction.maintenance.MaintenanceElection` as the maintenance jobs, on its own lease), so it
runs on one node of the cluster at a time, and its writes go through the store bound to that lease: a
controller that lost the election commits nothing even before it notices.

Every ``s3.cluster.poll.ms`` it reads the nodes, assignments and takeovers and takes at most one
decision (:func:`redirect`, then :func:`decide`: pure, facts in, a decision out; the controller
carries it out):

- **Redirect.** Assignment rows whose target has no valid session (it died, or closed, before it
  gained the stream) go to the row's from node if alive, else the next live node
  (``redirect_assignments``, which re-checks both in its transaction): the stream is not left CLOSED
  with nobody to open it (decision ``docs/decisions/0046-assignments-that-cannot-finish.md``).

- **Re-assign.** A takeover in flight whose taker's session is no longer valid, whose attempt made no
  progress (the taker reports it: ``updated_at_ms``) for ``stall_ms``, or that has no taker (PENDING:
  none was live, or the taker gave its attempt back) goes to the next live node
  (``reassign_takeover``: attempt + 1).
- **Fail.** Such a takeover that used ``attempts_max`` attempts goes to FAILED instead
  (``fail_takeover``): the one in-flight slot is free again, and the dead node may register again and
  replay its own WAL. A lapsed node whose takeover FAILED is not taken over again until it registers
  a new session (decision ``docs/decisions/0045-a-failing-takeover-ends.md``).
- **Start.** With no takeover in flight, a node whose leased session lapsed (the store's clock passed
  its lease) while it still owns OPENED streams is fenced and its takeover assigned to the next live
  node in one transaction (``start_takeover``); with no live node it is fenced and left PENDING.

At most one takeover is in flight cluster-wide (the store refuses a second). Takers are chosen round
robin over the live leased sessions in node id order, never the dead node. "Live" and "lapsed" are
judged at the store's clock; the store checks them again in the write transaction, so a judgement
made on stale rows is refused (ConflictError), logged and decided again at the next poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from s3stream.errors import S3StreamError
from s3stream.ids import NodeId, StreamId
from s3stream.logfmt import log_event
from s3stream.metadata.base import (
    Assignment,
    MetadataStore,
    NodeInfo,
    StreamMetadata,
    TakeoverInfo,
    TakeoverState,
)
from s3stream.metadata.cluster_ops import owner_of
from s3stream.metadata.node_ops import IN_FLIGHT, NO_LEASE, session_valid

log = logging.getLogger(__name__)

CONTROLLER_LEASE = "controller"
"""Name of the lease whose holder runs the failover controller."""
NO_NODE = -1


@dataclass(frozen=True, slots=True)
class StartTakeover:
    """Fence ``node_id`` (its session ``node_epoch`` lapsed) and assign its takeover to ``taker``."""

    node_id: NodeId
    node_epoch: int
    taker_node_id: int
    taker_node_epoch: int


@dataclass(frozen=True, slots=True)
class ReassignTakeover:
    """Give the in-flight takeover of ``node_id`` to ``taker`` (its taker lapsed, or it had none)."""

    node_id: NodeId
    taker_node_id: int
    taker_node_epoch: int
    previous_taker_node_id: int
    attempt: int


@dataclass(frozen=True, slots=True)
class FailTakeover:
    """Give the in-flight takeover of ``node_id`` up after ``attempt`` attempts (FAILED)."""

    node_id: NodeId
    attempt: int
    taker_node_id: int = NO_NODE


@dataclass(frozen=True, slots=True)
class RedirectAssignments:
    """Send the assignment rows of ``stream_ids`` (their target has no valid session) to ``taker``."""

    stream_ids: tuple[StreamId, ...]
    taker_node_id: int
    node_id: int = NO_NODE
    """The target that is gone (the first row's; for the log)."""


Decision = StartTakeover | ReassignTakeover | FailTakeover | RedirectAssignments

STALL_MS_DEFAULT = 60_000
ATTEMPTS_MAX_DEFAULT = 5


def session_live(info: NodeInfo, now_ms: int) -> bool:
    """A leased session whose lease runs at ``now_ms`` (an unleased one runs no watcher: never a taker)."""
    return info.lease_expires_at_ms != NO_LEASE and session_valid(info, info.node_epoch, now_ms)


def session_lapsed(info: NodeInfo, now_ms: int) -> bool:
    """A leased session whose lease ended at ``now_ms`` (its node may own streams nobody serves)."""
    return info.lease_expires_at_ms != NO_LEASE and not session_valid(info, info.node_epoch, now_ms)


def failed_sessions(takeovers: Sequence[TakeoverInfo]) -> set[tuple[int, int]]:
    """(node id, fence epoch) of every FAILED takeover: that fenced session is not taken over again;
    the node's next session (it registered again) may be."""
    return {(t.node_id, t.fence_epoch) for t in takeovers if t.state == TakeoverState.FAILED}


def owners(streams: Sequence[StreamMetadata]) -> set[int]:
    """Nodes owning an OPENED stream (:func:`~s3stream.metadata.cluster_ops.owner_of`)."""
    return {owner for owner in map(owner_of, streams) if owner != NO_NODE}


def next_taker(live: Sequence[NodeInfo], *, after: int, excluded: int) -> NodeInfo | None:
    """Round robin: the first live node with an id above ``after`` (wrapping), never ``excluded``."""
    candidates = sorted((n for n in live if n.node_id != excluded), key=lambda n: n.node_id)
    if not candidates:
        return None
    for info in candidates:
        if info.node_id > after:
            return info
    return candidates[0]


def redirect(
    nodes: Sequence[NodeInfo], rows: Sequence[Assignment], *, now_ms: int
) -> RedirectAssignments | None:
    """The rows whose target has no valid session, sent to the first such row's from node if its
    session is valid, else to the next live node after the gone target (all rows going to that node
    in one decision); None when every row's target is alive or no node is."""
    by_id = {n.node_id: n for n in nodes}

    def valid(node_id: int) -> bool:
        info = by_id.get(NodeId(node_id))
        return info is not None and session_valid(info, info.node_epoch, now_ms)

    stranded = [row for row in rows if not valid(row.to_node_id)]
    if not stranded:
        return None
    live = [n for n in nodes if session_live(n, now_ms)]
    targets: dict[StreamId, int] = {}
    for row in stranded:
        if valid(row.from_node_id):
            targets[row.stream_id] = row.from_node_id
        else:
            chosen = next_taker(live, after=row.to_node_id, excluded=row.to_node_id)
            if chosen is not None:
                targets[row.stream_id] = chosen.node_id
    if not targets:
        return None
    first = next(row for row in stranded if row.stream_id in targets)
    target = targets[first.stream_id]
    ids = tuple(sid for sid, to in targets.items() if to == target)
    return RedirectAssignments(ids, target, first.to_node_id)


def decide(
    nodes: Sequence[NodeInfo],
    takeovers: Sequence[TakeoverInfo],
    *,
    owner_ids: set[int] | None,
    now_ms: int,
    last_taker: int,
    stall_ms: int = STALL_MS_DEFAULT,
    attempts_max: int = ATTEMPTS_MAX_DEFAULT,
) -> Decision | None:
    """The controller's next step, or None. ``owner_ids``: the nodes owning OPENED streams (None when
    not read: then no takeover is started, only re-assignments are decided)."""
    live = [n for n in nodes if session_live(n, now_ms)]
    by_id = {n.node_id: n for n in nodes}
    in_flight = [t for t in takeovers if t.state in IN_FLIGHT]
    if in_flight:
        takeover = min(in_flight, key=lambda t: t.created_at_ms)
        taker = by_id.get(NodeId(takeover.taker_node_id))
        taker_valid = (
            takeover.state == TakeoverState.RUNNING
            and taker is not None
            and taker.node_epoch == takeover.taker_node_epoch
            and session_live(taker, now_ms)
        )
        if taker_valid and now_ms - takeover.updated_at_ms < stall_ms:
            return None
        if takeover.attempt >= attempts_max:
            return FailTakeover(takeover.node_id, takeover.attempt, takeover.taker_node_id)
        chosen = next_taker(live, after=last_taker, excluded=takeover.node_id)
        if chosen is None:
            return None
        return ReassignTakeover(
            takeover.node_id, chosen.node_id, chosen.node_epoch, takeover.taker_node_id, takeover.attempt + 1
        )
    if owner_ids is None:
        return None
    given_up = failed_sessions(takeovers)
    lapsed = sorted(
        (
            n
            for n in nodes
            if session_lapsed(n, now_ms)
            and n.node_id in owner_ids
            and (n.node_id, n.node_epoch) not in given_up
        ),
        key=lambda n: (n.lease_expires_at_ms, n.node_id),
    )
    if not lapsed:
        return None
    dead = lapsed[0]
    chosen = next_taker(live, after=last_taker, excluded=dead.node_id)
    if chosen is None:
        return StartTakeover(dead.node_id, dead.node_epoch, NO_NODE, NO_NODE)
    return StartTakeover(dead.node_id, dead.node_epoch, chosen.node_id, chosen.node_epoch)


def store_clock_ms(metadata: MetadataStore) -> Callable[[], int]:
    """The clock the store judges leases by (a PostgreSQL store's is the server's), else the wall clock."""
    from s3stream.metadata.store import TransactionalStore

    if isinstance(metadata, TransactionalStore):
        return metadata.now_ms
    return lambda: int(time.time() * 1000)


class FailoverController:
    """Scans nodes and takeovers every ``poll_ms`` and carries out :func:`decide`'s decisions.

    A job of the controller election (``start()`` / ``close()``, any number of times). ``metadata`` is
    the store bound to the controller lease: its ``start_takeover`` and ``reassign_takeover`` commit
    only while this node holds the lease."""

    def __init__(
        self,
        metadata: MetadataStore,
        *,
        node_id: NodeId,
        poll_ms: int,
        clock_ms: Callable[[], int] | None = None,
        stall_ms: int = STALL_MS_DEFAULT,
        attempts_max: int = ATTEMPTS_MAX_DEFAULT,
    ) -> None:
        if poll_ms <= 0:
            raise ValueError(f"poll_ms must be positive, got {poll_ms}")
        if stall_ms <= 0 or attempts_max <= 0:
            raise ValueError(f"stall_ms and attempts_max must be positive, got {stall_ms}, {attempts_max}")
        self.metadata = metadata
        self.node_id = node_id
        self.poll_ms = poll_ms
        self.stall_ms = stall_ms
        """An attempt with no progress reported for this long goes to another node."""
        self.attempts_max = attempts_max
        """Attempts after which a takeover is FAILED."""
        self.clock_ms = clock_ms or store_clock_ms(metadata)
        self.decisions: list[Decision] = []
        """Every decision carried out (committed), oldest first (the last 1,000)."""
        self._last_taker = NO_NODE
        self._idle: set[tuple[int, int]] = set()
        """Lapsed sessions seen owning no OPENED stream: a lapsed session opens nothing again."""
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._loop(), name="s3stream-failover-controller"
            )

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _loop(self) -> None:
        log_event(log, logging.INFO, "failover.started", node=self.node_id, poll_ms=self.poll_ms)
        while True:
            try:
                await self.scan_once()
            except (S3StreamError, OSError) as exc:
                log_event(log, logging.WARNING, "failover.scan_failed", node=self.node_id, error=exc)
            await asyncio.sleep(self.poll_ms / 1000)

    async def scan_once(self) -> Decision | None:
        """Read nodes, assignments and takeovers, decide, and carry the decision out. Returns it
        (None: nothing to do). Errors of the store's refusal (the facts changed) are logged, not raised."""
        nodes = await self.metadata.list_nodes()
        rows = await self.metadata.list_assignments()
        takeovers = await self.metadata.list_takeovers()
        now_ms = self.clock_ms()
        moved = redirect(nodes, rows, now_ms=now_ms)
        if moved is not None:
            try:
                written = await self.metadata.redirect_assignments(
                    stream_ids=moved.stream_ids, to_node_id=NodeId(moved.taker_node_id)
                )
            except S3StreamError as exc:
                log_event(log, logging.WARNING, "failover.redirect_refused", taker=moved.taker_node_id, error=exc)  # fmt: skip
                return None
            if written:
                log_event(log, logging.INFO, "failover.redirected", node=moved.node_id, taker=moved.taker_node_id, streams=[r.stream_id for r in written], reason="node has no session")  # fmt: skip
                self.decisions.append(moved)
                return moved
        owner_ids: set[int] | None = None
        self._idle &= {(n.node_id, n.node_epoch) for n in nodes}  # forget sessions that were replaced
        if not any(t.state in IN_FLIGHT for t in takeovers):
            skipped = self._idle | failed_sessions(takeovers)
            suspects = [
                n for n in nodes if session_lapsed(n, now_ms) and (n.node_id, n.node_epoch) not in skipped
            ]
            if suspects:
                owner_ids = owners(await self.metadata.list_streams())
                for n in suspects:
                    if n.node_id not in owner_ids:
                        self._idle.add((n.node_id, n.node_epoch))
        decision = decide(
            nodes,
            takeovers,
            owner_ids=owner_ids,
            now_ms=now_ms,
            last_taker=self._last_taker,
            stall_ms=self.stall_ms,
            attempts_max=self.attempts_max,
        )
        if decision is None:
            return None
        try:
            info = await self._carry_out(decision)
        except S3StreamError as exc:
            log_event(log, logging.WARNING, "failover.decision_refused", decision=type(decision).__name__, node=decision.node_id, taker=decision.taker_node_id, refused=type(exc).__name__, error=exc)  # fmt: skip
            return None
        if isinstance(decision, FailTakeover):
            log_event(log, logging.ERROR, "failover.takeover_failed", node=info.node_id, attempts=info.attempt, streams=[sid for sid, _ in info.streams], action=f"streams unserved until node {info.node_id} starts again on its WAL (docs/cluster.md, A takeover that fails)")  # fmt: skip
        elif decision.taker_node_id != NO_NODE:
            self._last_taker = decision.taker_node_id
        self.decisions.append(decision)
        del self.decisions[:-1000]
        log_event(log, logging.INFO, "failover.decision", decision=type(decision).__name__, node=info.node_id, taker=info.taker_node_id, state=info.state.name, attempt=info.attempt, streams=len(info.streams))  # fmt: skip
        return decision

    async def _carry_out(self, decision: Decision) -> TakeoverInfo:
        if isinstance(decision, FailTakeover):
            return await self.metadata.fail_takeover(node_id=decision.node_id)
        if isinstance(decision, StartTakeover):
            return await self.metadata.start_takeover(
                node_id=decision.node_id,
                node_epoch=decision.node_epoch,
                taker_node_id=NodeId(decision.taker_node_id),
                taker_node_epoch=decision.taker_node_epoch,
            )
        assert isinstance(decision, ReassignTakeover), decision
        return await self.metadata.reassign_takeover(
            node_id=decision.node_id,
            taker_node_id=NodeId(decision.taker_node_id),
            taker_node_epoch=decision.taker_node_epoch,
        )
