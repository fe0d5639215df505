"""The failover controller: the one node that notices dead nodes, fences them and assigns their WALs.

:class:`FailoverController` is a job of an election on the lease :data:`CONTROLLER_LEASE` (the same
:class:`~compaction.maintenance.MaintenanceElection` as the maintenance jobs, on its own lease), so it
runs on one node of the cluster at a time, and its writes go through the store bound to that lease: a
controller that lost the election commits nothing even before it notices.

Every ``s3.cluster.poll.ms`` it reads the nodes and the takeovers and takes at most one decision
(:func:`decide`: pure, facts in, a decision out; the controller carries it out):

- **Re-assign.** A takeover in flight whose taker's session is no longer valid (or that has no taker:
  PENDING) goes to the next live node (``reassign_takeover``: attempt + 1).
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
from s3stream.ids import NodeId
from s3stream.metadata.base import (
    MetadataStore,
    NodeInfo,
    StreamMetadata,
    StreamState,
    TakeoverInfo,
    TakeoverState,
)

log = logging.getLogger(__name__)

CONTROLLER_LEASE = "controller"
"""Name of the lease whose holder runs the failover controller."""
NO_NODE = -1
UNLEASED = -1
"""``lease_expires_at_ms`` of a session registered without a lease (it never lapses)."""
IN_FLIGHT = (TakeoverState.PENDING, TakeoverState.RUNNING)


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


Decision = StartTakeover | ReassignTakeover


def session_live(info: NodeInfo, now_ms: int) -> bool:
    """A leased session whose lease runs at ``now_ms`` (an unleased one runs no watcher: never a taker)."""
    return info.lease_expires_at_ms != UNLEASED and now_ms < info.lease_expires_at_ms


def session_lapsed(info: NodeInfo, now_ms: int) -> bool:
    """A leased session whose lease ended at ``now_ms`` (its node may own streams nobody serves)."""
    return info.lease_expires_at_ms != UNLEASED and now_ms >= info.lease_expires_at_ms


def owners(streams: Sequence[StreamMetadata]) -> set[int]:
    """Nodes owning an OPENED stream (the node of the stream's last range)."""
    return {m.ranges[-1].node_id for m in streams if m.state == StreamState.OPENED and m.ranges}


def next_taker(live: Sequence[NodeInfo], *, after: int, excluded: int) -> NodeInfo | None:
    """Round robin: the first live node with an id above ``after`` (wrapping), never ``excluded``."""
    candidates = sorted((n for n in live if n.node_id != excluded), key=lambda n: n.node_id)
    if not candidates:
        return None
    for info in candidates:
        if info.node_id > after:
            return info
    return candidates[0]


def decide(
    nodes: Sequence[NodeInfo],
    takeovers: Sequence[TakeoverInfo],
    *,
    owner_ids: set[int] | None,
    now_ms: int,
    last_taker: int,
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
        if taker_valid:
            return None
        chosen = next_taker(live, after=last_taker, excluded=takeover.node_id)
        if chosen is None:
            return None
        return ReassignTakeover(
            takeover.node_id, chosen.node_id, chosen.node_epoch, takeover.taker_node_id, takeover.attempt + 1
        )
    if owner_ids is None:
        return None
    lapsed = sorted(
        (n for n in nodes if session_lapsed(n, now_ms) and n.node_id in owner_ids),
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
        return metadata._clock_ms
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
    ) -> None:
        if poll_ms <= 0:
            raise ValueError(f"poll_ms must be positive, got {poll_ms}")
        self.metadata = metadata
        self.node_id = node_id
        self.poll_ms = poll_ms
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
        log.info("failover controller: node_id=%d started poll_ms=%d", self.node_id, self.poll_ms)
        while True:
            try:
                await self.scan_once()
            except (S3StreamError, OSError) as exc:
                log.warning("failover controller: node_id=%d scan failed: %s", self.node_id, exc)
            await asyncio.sleep(self.poll_ms / 1000)

    async def scan_once(self) -> Decision | None:
        """Read nodes and takeovers, decide, and carry the decision out. Returns it (None: nothing to
        do). Errors of the store's refusal (the facts changed) are logged, not raised."""
        nodes = await self.metadata.list_nodes()
        takeovers = await self.metadata.list_takeovers()
        now_ms = self.clock_ms()
        owner_ids: set[int] | None = None
        self._idle &= {(n.node_id, n.node_epoch) for n in nodes}  # forget sessions that were replaced
        if not any(t.state in IN_FLIGHT for t in takeovers):
            suspects = [
                n for n in nodes if session_lapsed(n, now_ms) and (n.node_id, n.node_epoch) not in self._idle
            ]
            if suspects:
                owner_ids = owners(await self.metadata.list_streams())
                for n in suspects:
                    if n.node_id not in owner_ids:
                        self._idle.add((n.node_id, n.node_epoch))
        decision = decide(nodes, takeovers, owner_ids=owner_ids, now_ms=now_ms, last_taker=self._last_taker)
        if decision is None:
            return None
        try:
            info = await self._carry_out(decision)
        except S3StreamError as exc:
            log.warning(
                "failover controller: decision=%s node_id=%d taker=%d refused=%s: %s",
                type(decision).__name__, decision.node_id, decision.taker_node_id, type(exc).__name__, exc,
            )  # fmt: skip
            return None
        if decision.taker_node_id != NO_NODE:
            self._last_taker = decision.taker_node_id
        self.decisions.append(decision)
        del self.decisions[:-1000]
        log.info(
            "failover controller: decision=%s node_id=%d taker=%d state=%s attempt=%d streams=%d",
            type(decision).__name__, info.node_id, info.taker_node_id, info.state.name, info.attempt,
            len(info.streams),
        )  # fmt: skip
        return decision

    async def _carry_out(self, decision: Decision) -> TakeoverInfo:
        if isinstance(decision, StartTakeover):
            return await self.metadata.start_takeover(
                node_id=decision.node_id,
                node_epoch=decision.node_epoch,
                taker_node_id=NodeId(decision.taker_node_id),
                taker_node_epoch=decision.taker_node_epoch,
            )
        return await self.metadata.reassign_takeover(
            node_id=decision.node_id,
            taker_node_id=NodeId(decision.taker_node_id),
            taker_node_epoch=decision.taker_node_epoch,
        )
