"""A move of many streams uses one metadata transaction per side: the old owner closes them with one
``close_streams``, the target opens them with ``open_streams`` (never one ``open_stream`` /
``close_stream`` per stream); ``Engine.open_streams`` reports each stream's outcome."""

from __future__ import annotations

from collections.abc import Sequence

from s3stream.engine.client import Stream
from s3stream.engine.stream import StreamHandle
from s3stream.errors import ConflictError, NotOwnerError
from s3stream.ids import NodeId, StreamId
from s3stream.metadata.base import StreamMetadata, StreamOutcome
from s3stream.metadata.memory import MemoryMetadataStore
from s3stream.model import RecordBatch
from s3stream.storage.memory import MemoryObjectStorage
from tests.unit.test_cluster_watcher import Cluster, next_event, read_all


class CountingStore(MemoryMetadataStore):
    """Records the stream opens and closes each node asks for, single and batched."""

    def __init__(self) -> None:
        super().__init__()
        self.single: list[tuple[str, int, StreamId]] = []
        self.batches: list[tuple[str, int, list[StreamId]]] = []

    async def open_stream(
        self, *, node_id: NodeId, node_epoch: int, stream_id: StreamId, epoch: int
    ) -> StreamMetadata:
        self.single.append(("open", node_id, stream_id))
        return await super().open_stream(
            node_id=node_id, node_epoch=node_epoch, stream_id=stream_id, epoch=epoch
        )

    async def close_stream(
        self, *, node_id: NodeId, node_epoch: int, stream_id: StreamId, epoch: int
    ) -> None:
        self.single.append(("close", node_id, stream_id))
        await super().close_stream(node_id=node_id, node_epoch=node_epoch, stream_id=stream_id, epoch=epoch)

    async def open_streams(
        self, *, node_id: NodeId, node_epoch: int, requests: Sequence[tuple[StreamId, int]]
    ) -> list[StreamOutcome]:
        self.batches.append(("open", node_id, [sid for sid, _ in requests]))
        return await super().open_streams(node_id=node_id, node_epoch=node_epoch, requests=requests)

    async def close_streams(
        self, *, node_id: NodeId, node_epoch: int, requests: Sequence[tuple[StreamId, int]]
    ) -> list[StreamOutcome]:
        self.batches.append(("close", node_id, [sid for sid, _ in requests]))
        return await super().close_streams(node_id=node_id, node_epoch=node_epoch, requests=requests)


async def test_a_move_of_fifty_streams_closes_them_in_one_batch_and_opens_them_in_batches() -> None:
    store = CountingStore()
    cluster = Cluster(store, MemoryObjectStorage())
    one, two = await cluster.join(1), await cluster.join(2)
    streams = [await one.client.streams.create_and_open_stream() for _ in range(50)]
    for i, stream in enumerate(streams):
        await stream.append(RecordBatch(b"s%d" % i))
    ids = sorted(s.stream_id for s in streams)
    store.single.clear()
    events_two = two.client.streams.assignments()
    await one.client.streams.reassign(ids, 2, timeout_s=30)
    gained: dict[StreamId, Stream] = {}
    while len(gained) < 50:
        event = await next_event(events_two)
        assert event.stream is not None
        gained[event.stream_id] = event.stream
    assert store.single == [], "no stream of the move was opened or closed on its own"
    closes = [sids for kind, node, sids in store.batches if kind == "close"]
    assert [sorted(sids) for sids in closes] == [ids]
    opens = [(node, sids) for kind, node, sids in store.batches if kind == "open"]
    assert {node for node, _ in opens} == {2}
    assert sorted(sid for _, sids in opens for sid in sids) == ids
    assert len(opens) <= 2  # a poll may read some streams just before the owner's close commits
    for i, stream in enumerate(streams):
        assert await read_all(gained[stream.stream_id]) == [b"s%d" % i]
    await one.client.close()
    await two.client.close()


async def test_engine_open_streams_reports_each_streams_outcome() -> None:
    store = CountingStore()
    cluster = Cluster(store, MemoryObjectStorage())
    one, two = await cluster.join(1), await cluster.join(2)
    elsewhere = await two.client.streams.create_and_open_stream()
    here = await one.client.streams.create_and_open_stream()
    fresh = [await one.client.engine.create_stream(None) for _ in range(2)]
    results = await one.client.engine.open_streams(
        [(fresh[0], 0), (elsewhere.stream_id, 1), (here.stream_id, 1), (fresh[1], 3)]
    )
    assert [sid for sid, _ in results] == [fresh[0], elsewhere.stream_id, here.stream_id, fresh[1]]
    first, owned, twice, last = (r for _, r in results)
    assert isinstance(first, StreamHandle)
    assert isinstance(last, StreamHandle)
    assert last.epoch == 3
    assert isinstance(owned, NotOwnerError)
    assert owned.owner_node_id == 2
    assert isinstance(twice, ConflictError)
    assert set(one.client.engine.streams) == {here.stream_id, *fresh}
    assert [(kind, sids) for kind, _, sids in store.batches] == [
        ("open", [fresh[0], elsewhere.stream_id, fresh[1]])
    ]
    await one.client.close()
    await two.client.close()
