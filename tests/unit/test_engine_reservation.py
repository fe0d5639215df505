"""Reserved streams on the in-memory twins: a commit that meets a reserved stream's data refused is
never resolved by dropping that data (the review's lost-data hazard), and reservations come and go."""

from __future__ import annotations

import asyncio

import pytest

from s3stream.direct.writer import write_object
from s3stream.engine.kvlog import DIRECT_KV_PREFIX
from s3stream.engine.stream import Status
from s3stream.errors import ClosedError, ConflictError, InvalidArgumentError, S3StreamError, UnavailableError
from s3stream.facade import SyncClient
from s3stream.ids import ObjectId, StreamId
from s3stream.metadata.base import CommitObjectsRequest, CommittedObject, StreamOffsetRange
from s3stream.metadata.memory import MemoryMetadataStore
from s3stream.model import RecordBatch
from s3stream.storage.memory import MemoryObjectStorage
from s3stream.storage.uri import open_storage
from tests.unit.test_engine import Node


async def test_a_reserved_streams_refused_upload_keeps_its_data_for_the_restart() -> None:
    node = Node()
    client = await node.open()
    stream = await client.streams.create_and_open_stream()
    for i in range(10):  # acknowledged, held in the WAL and the LogCache
        await stream.append(RecordBatch(b"%d" % i))
    client.engine.reserve_streams([stream.handle], "a test")
    # Someone commits [0, 5) behind the engine's back (what commit_external never lets happen).
    foreign = await node.metadata.prepare_objects(count=1, ttl_ms=60_000)
    await node.metadata.commit_objects(
        CommitObjectsRequest(
            node_id=client.engine.node_id,
            node_epoch=client.engine.node_epoch,
            objects=(CommittedObject(foreign, 10, (StreamOffsetRange(stream.stream_id, 0, 5),)),),
            stream_epochs={stream.stream_id: stream.epoch},
        )
    )
    with pytest.raises(S3StreamError):  # the engine's upload is refused over and over: it fails loudly
        await asyncio.wait_for(client.engine.force_upload(stream.stream_id), 10)
    assert "taken over" not in str(stream.handle.error)  # not dropped as lost
    client.engine.abandon()
    again = await node.open()  # the WAL still holds [0, 10): [5, 10) continues the foreign commit
    assert (await node.metadata.describe_stream(StreamId(stream.stream_id))).end_offset == 10
    await again.close()


async def test_reserve_is_all_or_none_and_release_leaves_other_states_alone() -> None:
    client = await Node().open()
    a = await client.streams.create_and_open_stream()
    b = await client.streams.create_and_open_stream()
    client.engine.reserve_streams([a.handle], "one")
    with pytest.raises(ConflictError, match="reserved by one"):
        client.engine.reserve_streams([b.handle, a.handle], "two")
    assert b.handle.status is Status.OPEN  # none reserved
    client.engine.reserve_streams([a.handle], "one")  # again for the same reason: a no-op
    with pytest.raises(ConflictError, match="reserved by one"):
        await a.close()
    with pytest.raises(ConflictError, match="already open"):
        await client.streams.open_stream(a.stream_id, epoch=0)
    client.engine.release_streams([a.handle, b.handle])
    assert (a.handle.status, b.handle.status) == (Status.OPEN, Status.OPEN)
    await a.close()
    client.engine.release_streams([a.handle])
    assert a.handle.status is Status.CLOSED
    with pytest.raises(ClosedError):
        client.engine.reserve_streams([a.handle], "closed")
    await client.close()


async def test_commit_external_checks_the_request_against_its_handles() -> None:
    client = await Node().open()
    a = await client.streams.create_and_open_stream()
    b = await client.streams.create_and_open_stream()
    first = await client.prepare_objects(1)
    obj = CommittedObject(first, 10, (StreamOffsetRange(a.stream_id, 0, 2),))

    def request(**changes: object) -> CommitObjectsRequest:
        fields: dict[str, object] = {
            "node_id": client.engine.node_id,
            "node_epoch": client.engine.node_epoch,
            "objects": (obj,),
            "stream_epochs": {a.stream_id: 0},
        }
        fields.update(changes)
        return CommitObjectsRequest(**fields)  # type: ignore[arg-type]

    engine = client.engine
    bad = [
        ([a.handle], request(node_epoch=engine.node_epoch + 1), "this engine is node"),
        ([b.handle], request(), "not among the handles"),
        ([a.handle], request(stream_epochs={a.stream_id: 3}), "open at epoch 0, not 3"),
        ([a.handle], request(stream_epochs={}), "has ranges but no epoch"),
        ([a.handle, a.handle], request(), "named twice"),
        ([a.handle], request(kv_puts={"k": b"v"}), "only KV keys under"),
    ]
    for handles, req, message in bad:
        with pytest.raises(ValueError, match=message):
            await engine.commit_external(handles, req)
        assert a.handle.status is Status.OPEN
    assert (await client.engine.metadata.get_object(ObjectId(first))).state.name == "PREPARED"
    await client.close()


def test_the_sync_client_commits_an_object_of_the_direct_writer() -> None:
    storage = open_storage("mem://sync-direct-commit")
    assert isinstance(storage, MemoryObjectStorage)
    client = SyncClient.start(lambda: Node(storage=storage).open())
    try:
        stream = client.streams.create_and_open_stream()
        for i in range(3):
            stream.append(RecordBatch(b"wal-%d" % i))
        first = client.prepare_objects(2, ttl_ms=60_000)
        records = [(stream.stream_id, stream.epoch, o, 1, b"ext-%d" % o) for o in range(3, 6)]
        info = write_object("mem://sync-direct-commit", client.client.config.namespace, first, records)
        with pytest.raises(InvalidArgumentError, match="SyncStreams"):
            client.commit_objects([stream.stream], [info.committed()])  # type: ignore[list-item]
        client.commit_objects(
            [stream],
            [info.committed()],
            kv_puts={DIRECT_KV_PREFIX + "p": b"1"},
            release_ids=[ObjectId(first + 1)],
        )
        assert (stream.next_offset, stream.confirm_offset) == (6, 6)
        got: list[bytes] = []
        while len(got) < 6:
            got += [bytes(b.payload) for b in stream.fetch(len(got), 6)]
        assert got == [b"wal-0", b"wal-1", b"wal-2", b"ext-3", b"ext-4", b"ext-5"]
        assert client.kv.get(DIRECT_KV_PREFIX + "p") == b"1"
    finally:
        client.close()


class FlakyCommitStore(MemoryMetadataStore):
    """``commit_objects`` fails once with UnavailableError, after committing (``commit_first``) or not:
    the two unknown outcomes of a store that went away mid-call."""

    def __init__(self, *, commit_first: bool) -> None:
        super().__init__()
        self.commit_first = commit_first
        self.failures = 1

    async def commit_objects(self, request: CommitObjectsRequest) -> None:
        if self.failures:
            self.failures -= 1
            if self.commit_first:
                await super().commit_objects(request)
            raise UnavailableError("the store went away mid-call")
        await super().commit_objects(request)


@pytest.mark.parametrize("commit_first", [True, False], ids=["committed", "not committed"])
async def test_a_commit_with_an_unknown_outcome_keeps_its_streams_reserved_until_sent_again(
    commit_first: bool,
) -> None:
    node = Node(metadata=FlakyCommitStore(commit_first=commit_first))
    client = await node.open()
    stream = await client.streams.create_and_open_stream()
    await stream.append(RecordBatch(b"wal-0"))
    first = await client.prepare_objects(1)
    obj = CommittedObject(first, 10, (StreamOffsetRange(stream.stream_id, 1, 4),))
    puts = {DIRECT_KV_PREFIX + "p": b"1"}
    with pytest.raises(UnavailableError):
        await client.commit_objects([stream], [obj], kv_puts=puts)
    assert stream.handle.status.name == "RESERVED"  # appends could take offsets the commit used
    with pytest.raises(ConflictError, match="reserved by an external commit"):
        await stream.append(RecordBatch(b"refused"))
    await client.commit_objects([stream], [obj], kv_puts=puts)  # the same request settles it
    assert stream.handle.status is Status.OPEN
    assert (stream.next_offset, stream.confirm_offset) == (4, 4)
    assert (await node.metadata.describe_stream(stream.stream_id)).end_offset == 4
    assert await client.kv.get(DIRECT_KV_PREFIX + "p") == b"1"
    assert await stream.append(RecordBatch(b"wal-4")) == 4
    await client.close()
