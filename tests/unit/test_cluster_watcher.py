"""Reassignment between two engines on one metadata store (in-process): the owner stops taking appends
(MovedError naming the target), finishes those in flight, uploads and closes; the target opens at the next
epoch; both publish their events; no acknowledged record is lost or duplicated."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from s3stream.cluster.events import AssignmentEvent, AssignmentHub, Subscription
from s3stream.cluster.watcher import ClusterWatcher
from s3stream.engine.client import Client, Stream
from s3stream.engine.core import Engine
from s3stream.errors import ErrorCode, FencedError, MovedError, NotFoundError, NotOwnerError
from s3stream.ids import NodeId, StreamId
from s3stream.metadata.base import StreamState
from s3stream.metadata.memory import MemoryMetadataStore
from s3stream.model import RecordBatch
from s3stream.storage.memory import MemoryObjectStorage
from tests.unit.test_engine import SMALL
from tests.unit.test_engine_append_path import ReorderingWal

CONFIG = SMALL.replace(cluster_poll_ms=10)
LEASE_MS = 60_000


@dataclass
class Member:
    client: Client
    watcher: ClusterWatcher
    wal: ReorderingWal

    @property
    def node_id(self) -> int:
        return self.client.engine.node_id


@dataclass
class Cluster:
    metadata: MemoryMetadataStore
    storage: MemoryObjectStorage

    async def join(self, node_id: int) -> Member:
        from s3stream.assembly import build_reader

        info = await self.metadata.open_node(node_id=NodeId(node_id), lease_ms=LEASE_MS)
        wal = ReorderingWal()
        engine = Engine(
            CONFIG,
            wal=wal,
            metadata=self.metadata,
            storage=self.storage,
            node_id=NodeId(node_id),
            node_epoch=info.node_epoch,
            reader=build_reader(CONFIG, self.metadata, self.storage),
        )
        await engine.start()
        hub = AssignmentHub()
        watcher = ClusterWatcher(engine, self.metadata, hub, poll_ms=CONFIG.cluster_poll_ms)
        watcher.start()
        client = Client(engine, self.metadata, hub=hub, pre_closers=[watcher.close])
        return Member(client, watcher, wal)


@pytest.fixture
async def cluster() -> Cluster:
    return Cluster(MemoryMetadataStore(), MemoryObjectStorage())


async def next_event(subscription: Subscription, timeout_s: float = 5.0) -> AssignmentEvent:
    return await asyncio.wait_for(anext(subscription), timeout_s)


async def read_all(stream: Stream) -> list[bytes]:
    payloads, offset = [], stream.start_offset
    while offset < stream.confirm_offset:
        for batch in await stream.fetch(offset, stream.confirm_offset):
            payloads.append(batch.payload)
            offset = batch.base_offset + batch.count
    return payloads


async def test_a_moved_stream_refuses_appends_naming_the_target_and_the_target_continues_it(
    cluster: Cluster,
) -> None:
    one, two = await cluster.join(1), await cluster.join(2)
    stream = await one.client.streams.create_and_open_stream()
    for i in range(3):
        await stream.append(RecordBatch(b"r%d" % i))
    events_one, events_two = one.client.streams.assignments(), two.client.streams.assignments()
    await one.client.streams.reassign([stream.stream_id], 2, timeout_s=10)
    gained = await next_event(events_two)
    assert (gained.kind, gained.stream_id) == ("gained", stream.stream_id)
    assert gained.stream is not None
    assert gained.stream.epoch == stream.epoch + 1
    lost = await next_event(events_one)
    assert (lost.kind, lost.stream_id, lost.stream) == ("lost", stream.stream_id, None)
    with pytest.raises(MovedError) as moved:
        await stream.append(RecordBatch(b"late"))
    assert moved.value.owner_node_id == 2
    assert moved.value.code == ErrorCode.STREAM_MOVED
    assert await gained.stream.append(RecordBatch(b"r3")) == 3
    assert await read_all(gained.stream) == [b"r0", b"r1", b"r2", b"r3"]
    meta = await cluster.metadata.describe_stream(stream.stream_id)
    assert meta.state is StreamState.OPENED
    assert meta.ranges[-1].node_id == 2
    assert await cluster.metadata.list_assignments() == []
    await one.client.close()
    await two.client.close()


async def test_appends_in_flight_when_the_move_starts_finish_before_the_close(cluster: Cluster) -> None:
    one, two = await cluster.join(1), await cluster.join(2)
    stream = await one.client.streams.create_and_open_stream()
    in_flight = await one.wal.held_appends(stream, b"a", b"b", b"c")
    events_two = two.client.streams.assignments()
    move = asyncio.create_task(one.client.streams.reassign([stream.stream_id], 2, timeout_s=10))
    while stream.handle.moved_to is None:
        await asyncio.sleep(0.005)
    with pytest.raises(MovedError):
        await stream.append(RecordBatch(b"refused"))
    await asyncio.sleep(0.05)
    assert not move.done()  # the close waits for the appends in flight
    one.wal.hold = False
    for release in one.wal.held:
        release.set_result(None)
    assert await asyncio.gather(*in_flight) == [0, 1, 2]
    await move
    gained = await next_event(events_two)
    assert gained.stream is not None
    assert await read_all(gained.stream) == [b"a", b"b", b"c"]
    await one.client.close()
    await two.client.close()


async def test_opening_a_stream_a_live_node_owns_names_that_node(cluster: Cluster) -> None:
    one, two = await cluster.join(1), await cluster.join(2)
    stream = await one.client.streams.create_and_open_stream()
    with pytest.raises(NotOwnerError) as refused:
        await two.client.streams.open_stream(stream.stream_id, epoch=stream.epoch + 1)
    assert refused.value.owner_node_id == 1
    assert not isinstance(refused.value, MovedError)
    await one.client.close()
    await two.client.close()


async def test_a_hundred_streams_move_in_one_request(cluster: Cluster) -> None:
    one, two = await cluster.join(1), await cluster.join(2)
    streams = [await one.client.streams.create_and_open_stream() for _ in range(100)]
    for i, stream in enumerate(streams):
        await stream.append(RecordBatch(b"s%d" % i))
    events_two = two.client.streams.assignments()
    await one.client.streams.reassign([s.stream_id for s in streams], 2, timeout_s=30)
    gained: dict[StreamId, Stream] = {}
    while len(gained) < 100:
        event = await next_event(events_two)
        assert event.kind == "gained"
        assert event.stream is not None
        gained[event.stream_id] = event.stream
    for i, stream in enumerate(streams):
        assert await gained[stream.stream_id].append(RecordBatch(b"t%d" % i)) == 1
        assert await read_all(gained[stream.stream_id]) == [b"s%d" % i, b"t%d" % i]
    assert one.client.engine.streams == {}
    await one.client.close()
    await two.client.close()


async def test_two_racing_reassignments_leave_exactly_one_owner(cluster: Cluster) -> None:
    one, two, three = await cluster.join(1), await cluster.join(2), await cluster.join(3)
    stream = await one.client.streams.create_and_open_stream()
    await stream.append(RecordBatch(b"x"))
    # Both requests land before the owner's next poll: the later target wins.
    await asyncio.gather(
        cluster.metadata.request_reassign(stream_ids=[stream.stream_id], to_node_id=NodeId(2)),
        cluster.metadata.request_reassign(stream_ids=[stream.stream_id], to_node_id=NodeId(3)),
    )
    deadline = asyncio.get_running_loop().time() + 10
    while True:
        meta = await cluster.metadata.describe_stream(stream.stream_id)
        if meta.state is StreamState.OPENED and meta.ranges[-1].node_id != 1:
            break
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.1)  # a second open, were there one, would have happened by now
    owners = [m.node_id for m in (two, three) if stream.stream_id in m.client.engine.streams]
    assert owners == [3]
    meta = await cluster.metadata.describe_stream(stream.stream_id)
    assert meta.ranges[-1].node_id == 3
    owned = three.client.engine.streams[stream.stream_id]
    assert await read_all(Stream(three.client.engine, owned)) == [b"x"]
    for member in (one, two, three):
        await member.client.close()


async def test_a_fenced_node_loses_every_stream_and_its_subscriptions_end(cluster: Cluster) -> None:
    one = await cluster.join(1)
    streams = [await one.client.streams.create_and_open_stream() for _ in range(2)]
    events = one.client.streams.assignments()
    error = FencedError("lease ended", code=ErrorCode.NODE_FENCED)
    one.client.engine.fence(error)
    one.watcher.on_fenced(error)
    got = {(await next_event(events)).stream_id for _ in streams}
    assert got == {s.stream_id for s in streams}
    with pytest.raises(FencedError):
        await next_event(events)
    await one.client.close()


async def test_reassign_to_a_node_without_a_session_is_refused(cluster: Cluster) -> None:
    one = await cluster.join(1)
    stream = await one.client.streams.create_and_open_stream()
    with pytest.raises(NotFoundError) as refused:
        await one.client.streams.reassign([stream.stream_id], 9)
    assert refused.value.code == ErrorCode.NODE_NOT_ALIVE
    await stream.append(RecordBatch(b"still mine"))
    await one.client.close()


async def test_a_client_closed_during_a_move_finishes_it_and_the_target_gains_the_stream(
    cluster: Cluster,
) -> None:
    one, two = await cluster.join(1), await cluster.join(2)
    stream = await one.client.streams.create_and_open_stream()
    in_flight = await one.wal.held_appends(stream, b"a", b"b")
    events_two = two.client.streams.assignments()
    await cluster.metadata.request_reassign(stream_ids=[stream.stream_id], to_node_id=NodeId(2))
    while stream.handle.moved_to is None:
        await asyncio.sleep(0.005)
    closing = asyncio.create_task(one.client.close())
    await asyncio.sleep(0.05)
    one.wal.hold = False
    for release in one.wal.held:
        release.set_result(None)
    assert await asyncio.gather(*in_flight) == [0, 1]
    await closing
    gained = await next_event(events_two)
    assert gained.stream is not None
    assert await read_all(gained.stream) == [b"a", b"b"]
    await two.client.close()
