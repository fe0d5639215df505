"""A stream is never left CLOSED with nobody to open it: a request back to its owner while the owner
moves it ends with the owner holding it again, and a row to a target that goes before it gained the
stream is redirected by the failover controller (decision 0046)."""

from __future__ import annotations

import asyncio

from s3stream.cluster.controller import FailoverController, RedirectAssignments
from s3stream.ids import NodeId
from s3stream.metadata.base import StreamState
from s3stream.model import RecordBatch
from tests.unit.test_cluster_watcher import Cluster, cluster  # noqa: F401


async def wait_opened_on(members: Cluster, stream_id: int, node_id: int, timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while True:
            meta = await members.metadata.describe_stream(stream_id)
            held = meta.state is StreamState.OPENED and meta.ranges[-1].node_id == node_id
            if held and not await members.metadata.list_assignments():
                return
            await asyncio.sleep(0.01)


async def test_a_request_back_to_the_owner_mid_move_ends_with_the_owner_holding_it(
    cluster: Cluster,  # noqa: F811
) -> None:
    one, two = await cluster.join(1), await cluster.join(2)
    stream = await one.client.streams.create_and_open_stream()
    in_flight = await one.wal.held_appends(stream, b"a")
    await cluster.metadata.request_reassign(stream_ids=[stream.stream_id], to_node_id=NodeId(2))
    while stream.handle.moved_to is None:
        await asyncio.sleep(0.005)
    back = asyncio.create_task(one.client.streams.reassign([stream.stream_id], 1, timeout_s=5))
    await asyncio.sleep(0.05)
    assert not back.done(), "reassign waits until the owner holds it again, not while it is moving"
    one.wal.hold = False
    for release in one.wal.held:
        release.set_result(None)
    await asyncio.gather(*in_flight)
    await back
    meta = await cluster.metadata.describe_stream(stream.stream_id)
    assert (meta.state, meta.ranges[-1].node_id) == (StreamState.OPENED, 1)
    assert await cluster.metadata.list_assignments() == []
    assert stream.stream_id in one.client.engine.streams
    assert stream.stream_id not in two.client.engine.streams
    for m in (one, two):
        await m.client.close()


async def test_a_request_back_to_the_owner_before_it_moves_is_settled(cluster: Cluster) -> None:  # noqa: F811
    one = await cluster.join(1)
    await cluster.join(2)
    stream = await one.client.streams.create_and_open_stream()
    await one.watcher.close()  # the owner does not act on the first request
    await cluster.metadata.request_reassign(stream_ids=[stream.stream_id], to_node_id=NodeId(2))
    await cluster.metadata.request_reassign(stream_ids=[stream.stream_id], to_node_id=NodeId(1))
    assert [r.to_node_id for r in await cluster.metadata.list_assignments()] == [1]
    await one.watcher.poll_once()
    await wait_opened_on(cluster, stream.stream_id, 1)
    assert stream.handle.moved_to is None
    await stream.append(RecordBatch(b"still here"))
    await one.client.close()


async def test_a_row_overwritten_mid_move_ends_on_the_last_target(cluster: Cluster) -> None:  # noqa: F811
    one, two, three = await cluster.join(1), await cluster.join(2), await cluster.join(3)
    stream = await one.client.streams.create_and_open_stream()
    in_flight = await one.wal.held_appends(stream, b"a")
    await cluster.metadata.request_reassign(stream_ids=[stream.stream_id], to_node_id=NodeId(2))
    while stream.handle.moved_to is None:
        await asyncio.sleep(0.005)
    await cluster.metadata.request_reassign(stream_ids=[stream.stream_id], to_node_id=NodeId(3))
    one.wal.hold = False
    for release in one.wal.held:
        release.set_result(None)
    await asyncio.gather(*in_flight)
    await wait_opened_on(cluster, stream.stream_id, 3)
    assert stream.stream_id in three.client.engine.streams
    assert stream.stream_id not in two.client.engine.streams
    for m in (one, two, three):
        await m.client.close()


async def test_a_row_to_a_target_that_died_before_gaining_goes_back_to_the_from_node(
    cluster: Cluster,  # noqa: F811
) -> None:
    one, two = await cluster.join(1), await cluster.join(2)
    stream = await one.client.streams.create_and_open_stream()
    await stream.append(RecordBatch(b"x"))
    await two.watcher.close()  # node 2 stops polling, then its session ends
    await cluster.metadata.request_reassign(stream_ids=[stream.stream_id], to_node_id=NodeId(2))
    while (await cluster.metadata.describe_stream(stream.stream_id)).state is not StreamState.CLOSED:
        await asyncio.sleep(0.01)
    await cluster.metadata.close_node(node_id=NodeId(2), node_epoch=two.client.engine.node_epoch)
    controller = FailoverController(cluster.metadata, node_id=NodeId(1), poll_ms=10)
    decision = await controller.scan_once()
    assert isinstance(decision, RedirectAssignments)
    assert (decision.stream_ids, decision.taker_node_id) == ((stream.stream_id,), 1)
    await wait_opened_on(cluster, stream.stream_id, 1)
    assert await controller.scan_once() is None
    await one.client.close()
