"""The failover controller on PostgreSQL: controllers racing, a lapsed taker, the lease guard.

Two store objects (two connection pools, as two node processes have) share one fresh schema and one
fake clock, so leases lapse exactly when the test says.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from s3stream.cluster.controller import CONTROLLER_LEASE, FailoverController, ReassignTakeover, StartTakeover
from s3stream.ids import NodeId
from s3stream.metadata.base import StreamState, TakeoverState
from s3stream.metadata.postgres import PostgresMetadataStore
from tests.support.metadata_contract import FakeClock

LEASE_MS = 10_000


@pytest.fixture
async def stores(
    pg_url: str,
) -> AsyncIterator[tuple[PostgresMetadataStore, PostgresMetadataStore, FakeClock]]:
    clock = FakeClock()
    a = await PostgresMetadataStore.open(pg_url, clock_ms=clock)
    b = await PostgresMetadataStore.open(pg_url, clock_ms=clock)
    yield a, b, clock
    await a.close()
    await b.close()


async def _cluster_with_a_dead_owner(store: PostgresMetadataStore, clock: FakeClock) -> dict[int, int]:
    """Nodes 1 and 2 live, node 3 lapsed owning two OPENED streams; returns node id -> epoch."""
    epochs = {n: (await store.open_node(node_id=NodeId(n), lease_ms=LEASE_MS)).node_epoch for n in (1, 2, 3)}
    for _ in range(2):
        sid = await store.create_stream(node_id=NodeId(3), node_epoch=epochs[3])
        await store.open_stream(node_id=NodeId(3), node_epoch=epochs[3], stream_id=sid, epoch=0)
    clock.advance(LEASE_MS // 2)
    for n in (1, 2):
        await store.heartbeat(node_id=NodeId(n), node_epoch=epochs[n], lease_ms=LEASE_MS)
    clock.advance(LEASE_MS // 2 + 1)  # node 3's lease ended; 1 and 2 renewed theirs
    return epochs


async def test_two_controllers_racing_start_exactly_one_takeover(
    stores: tuple[PostgresMetadataStore, PostgresMetadataStore, FakeClock],
) -> None:
    a, b, clock = stores
    epochs = await _cluster_with_a_dead_owner(a, clock)
    controllers = [
        FailoverController(store, node_id=NodeId(n), poll_ms=50, clock_ms=clock)
        for store, n in ((a, 1), (b, 2))
    ]
    decisions = await asyncio.gather(*(c.scan_once() for c in controllers * 3))
    starts = [d for d in decisions if isinstance(d, StartTakeover)]
    assert len(starts) == 1, decisions
    [takeover] = await a.list_takeovers()
    assert (takeover.node_id, takeover.node_epoch, takeover.state) == (3, epochs[3], TakeoverState.RUNNING)
    assert (takeover.taker_node_id, takeover.attempt, len(takeover.streams)) == (
        starts[0].taker_node_id,
        1,
        2,
    )
    assert takeover.taker_node_id in (1, 2)
    nodes = {n.node_id: n.node_epoch for n in await b.list_nodes()}
    assert nodes[NodeId(3)] == epochs[3] + 1, "fenced once"
    # In flight with a live taker: nothing more to decide, whoever scans.
    assert await asyncio.gather(*(c.scan_once() for c in controllers)) == [None, None]


async def test_a_takeover_whose_taker_lapsed_goes_to_the_other_live_node(
    stores: tuple[PostgresMetadataStore, PostgresMetadataStore, FakeClock],
) -> None:
    a, _, clock = stores
    epochs = await _cluster_with_a_dead_owner(a, clock)
    controller = FailoverController(a, node_id=NodeId(1), poll_ms=50, clock_ms=clock)
    start = await controller.scan_once()
    assert isinstance(start, StartTakeover)
    first, other = start.taker_node_id, 3 - start.taker_node_id
    clock.advance(LEASE_MS // 4)
    await a.heartbeat(node_id=NodeId(other), node_epoch=epochs[other], lease_ms=LEASE_MS)
    clock.advance(LEASE_MS // 2)  # the first taker's lease ended (renewed last at 1/2 lease)
    reassign = await controller.scan_once()
    assert reassign == ReassignTakeover(NodeId(3), other, epochs[other], first, 2)
    [takeover] = await a.list_takeovers()
    assert (takeover.taker_node_id, takeover.attempt, takeover.state) == (other, 2, TakeoverState.RUNNING)
    # The new taker takes the streams over even though the first one's session is gone.
    taken = await a.takeover_streams(
        node_id=NodeId(3), taker_node_id=NodeId(other), taker_node_epoch=epochs[other]
    )
    assert {meta.ranges[-1].node_id for meta, _ in taken} == {other}
    await a.finish_takeover(
        node_id=NodeId(3), taker_node_id=NodeId(other), taker_node_epoch=epochs[other], wal_end_offset=0
    )
    assert {m.state for m in await a.list_streams()} == {StreamState.CLOSED}
    assert await controller.scan_once() is None  # done; node 3 owns nothing now


async def test_only_the_controller_lease_holder_commits_a_decision(
    stores: tuple[PostgresMetadataStore, PostgresMetadataStore, FakeClock],
) -> None:
    a, b, clock = stores
    epochs = await _cluster_with_a_dead_owner(a, clock)
    a.bind_node(NodeId(1), epochs[1])
    b.bind_node(NodeId(2), epochs[2])
    await b.acquire_lease(name=CONTROLLER_LEASE, node_id=NodeId(2), node_epoch=epochs[2], lease_ms=LEASE_MS)
    loser = FailoverController(a.bind_lease(CONTROLLER_LEASE), node_id=NodeId(1), poll_ms=50, clock_ms=clock)
    holder = FailoverController(b.bind_lease(CONTROLLER_LEASE), node_id=NodeId(2), poll_ms=50, clock_ms=clock)
    assert await loser.scan_once() is None  # decided, refused by the store (not the lease holder)
    assert await a.list_takeovers() == []
    assert isinstance(await holder.scan_once(), StartTakeover)
    assert [t.node_id for t in await a.list_takeovers()] == [3]
    assert loser.decisions == []
