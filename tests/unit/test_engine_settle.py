"""Settling an external commit with an unknown outcome without sending it again (``settle_external``),
on the in-memory twins: the handles take the metadata's ends and accept appends again, whether the
commit went through or not; other reservations and unreserved streams are left alone."""

from __future__ import annotations

import pytest

from s3stream.engine.kvlog import DIRECT_KV_PREFIX
from s3stream.engine.stream import Status
from s3stream.errors import ConflictError, UnavailableError
from s3stream.ids import StreamId
from s3stream.metadata.base import CommittedObject, StreamMetadata, StreamOffsetRange
from s3stream.model import RecordBatch
from tests.unit.test_engine import Node
from tests.unit.test_engine_reservation import FlakyCommitStore


class CountingStore(FlakyCommitStore):
    """Counts ``describe_stream`` calls; ``describe_fails`` makes them raise UnavailableError."""

    def __init__(self, *, commit_first: bool) -> None:
        super().__init__(commit_first=commit_first)
        self.describes = 0
        self.describe_fails = False

    async def describe_stream(self, stream_id: StreamId) -> StreamMetadata:
        self.describes += 1
        if self.describe_fails:
            raise UnavailableError("the store is still away")
        return await super().describe_stream(stream_id)


@pytest.mark.parametrize("commit_first", [True, False], ids=["committed", "not committed"])
async def test_settle_moves_the_handles_to_the_metadatas_ends_and_releases_them(commit_first: bool) -> None:
    store = CountingStore(commit_first=commit_first)
    node = Node(metadata=store)
    client = await node.open()
    a = await client.streams.create_and_open_stream()
    b = await client.streams.create_and_open_stream()
    await a.append(RecordBatch(b"wal-0"))
    first = await client.prepare_objects(1)
    obj = CommittedObject(first, 10, (StreamOffsetRange(a.stream_id, 1, 4),))
    with pytest.raises(UnavailableError):
        await client.commit_objects([a, b], [obj], kv_puts={DIRECT_KV_PREFIX + "p": b"1"})
    assert (a.handle.status, b.handle.status) == (Status.RESERVED, Status.RESERVED)
    store.describe_fails = True  # the store is still unreachable: nothing is settled
    with pytest.raises(UnavailableError):
        await client.settle_external([a, b])
    assert (a.handle.status, b.handle.status) == (Status.RESERVED, Status.RESERVED)
    store.describe_fails = False
    assert await client.settle_external([a, b]) == 2
    assert (a.handle.status, b.handle.status) == (Status.OPEN, Status.OPEN)
    end = 4 if commit_first else 1
    assert (a.next_offset, a.confirm_offset) == (end, end)
    assert (b.next_offset, b.confirm_offset) == (0, 0)
    assert (await node.metadata.describe_stream(a.stream_id)).end_offset == end
    assert await a.append(RecordBatch(b"next")) == end
    store.describes = 0
    assert await client.settle_external([a, b]) == 0  # nothing reserved: no metadata read
    assert store.describes == 0
    await client.close()


async def test_settle_leaves_other_reservations_and_refuses_a_handle_it_cannot_explain() -> None:
    node = Node(metadata=FlakyCommitStore(commit_first=True))
    client = await node.open()
    a = await client.streams.create_and_open_stream()
    b = await client.streams.create_and_open_stream()
    client.engine.reserve_streams([b.handle], "a test")
    assert await client.settle_external([a, b]) == 0
    assert (a.handle.status, b.handle.status) == (Status.OPEN, Status.RESERVED)
    client.engine.release_streams([b.handle])
    first = await client.prepare_objects(1)
    obj = CommittedObject(first, 10, (StreamOffsetRange(a.stream_id, 0, 3),))
    with pytest.raises(UnavailableError):
        await client.commit_objects([a], [obj])
    a.handle.next_offset = a.handle.confirm_offset = 5  # beyond the metadata's end: not this commit's doing
    with pytest.raises(ConflictError, match="cannot be settled"):
        await client.settle_external([a])
    assert a.handle.status is Status.RESERVED
    client.engine.release_streams([a.handle])
    a.handle.next_offset = a.handle.confirm_offset = 3
    await client.close()
