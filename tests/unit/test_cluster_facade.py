"""The blocking facade's reassignment: ``SyncStreamClient.reassign`` and the blocking ``assignments()`` iterator
(events carry a SyncStream to append to)."""

from __future__ import annotations

import pytest

from s3stream.engine.client import Client
from s3stream.errors import MovedError
from s3stream.facade import SyncClient, SyncStream
from s3stream.metadata.memory import MemoryMetadataStore
from s3stream.model import RecordBatch
from s3stream.storage.memory import MemoryObjectStorage
from tests.unit.test_cluster_watcher import Cluster


def test_a_sync_client_reassigns_and_the_target_follows_its_events() -> None:
    members: list[Client] = []

    async def opener() -> Client:
        cluster = Cluster(MemoryMetadataStore(), MemoryObjectStorage())
        for node_id in (1, 2):
            members.append((await cluster.join(node_id)).client)
        return members[0]

    one = SyncClient.start(opener)
    two = SyncClient(members[1], one._run)  # node 2 on the same loop thread
    try:
        stream = one.streams.create_and_open_stream()
        assert stream.append(RecordBatch(b"a")) == 0
        events = two.streams.assignments()
        one.streams.reassign([stream.stream_id], 2, timeout_s=10)
        event = next(events)
        assert (event.kind, event.stream_id) == ("gained", stream.stream_id)
        assert isinstance(event.stream, SyncStream)
        assert event.stream.append(RecordBatch(b"b")) == 1
        with pytest.raises(MovedError):
            stream.append(RecordBatch(b"late"))
        events.close()
        assert list(events) == []
    finally:
        one._run.run(members[1].close())
        one.close()
