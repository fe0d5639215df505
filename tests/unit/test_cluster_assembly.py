"""The assembly's cluster wiring: the session records the WAL's absolute path, heartbeats report the engine's
un-uploaded WAL bytes, the watcher runs on a shared store, and a node whose takeover is in flight waits
(bounded by ``s3.close.timeout.ms``) instead of opening its WAL."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from s3stream import RecordBatch
from s3stream.assembly import WAL_FILE, open_client
from s3stream.cluster.watcher import ClusterWatcher
from s3stream.config import Config
from s3stream.engine.heartbeat import Heartbeat
from s3stream.errors import ErrorCode, UnavailableError
from s3stream.ids import NodeId
from s3stream.metadata.base import TakeoverState
from s3stream.metadata.memory import MemoryMetadataStore
from s3stream.storage.memory import MemoryObjectStorage

CONFIG = Config(wal_capacity_bytes=8 << 20, wal_record_max_bytes=1 << 20, record_max_bytes=1 << 20)


class WallClock:
    def __init__(self) -> None:
        self.ms = 5_000_000

    def __call__(self) -> int:
        return self.ms


async def test_a_node_on_a_shared_store_records_its_wal_and_reports_its_pending_bytes(tmp_path: Path) -> None:
    store = MemoryMetadataStore()
    client = await open_client(
        tmp_path / "n1", config=CONFIG.replace(node_id=1), metadata=store, storage=MemoryObjectStorage()
    )
    try:
        assert isinstance(client.components["watcher"], ClusterWatcher)
        (runtime,) = await store.list_node_runtime()
        assert runtime.wal_path == str((tmp_path / "n1" / WAL_FILE).absolute())
        stream = await client.streams.create_and_open_stream()
        await stream.append(RecordBatch(b"x" * 1000))
        assert client.engine.wal_pending_bytes > 1000
        heartbeat = client.components["heartbeat"]
        assert isinstance(heartbeat, Heartbeat)
        await heartbeat.renew_once()
        (runtime,) = await store.list_node_runtime()
        assert runtime.wal_pending_bytes == client.engine.wal_pending_bytes
    finally:
        await client.close()


async def test_a_restart_during_a_takeover_of_the_node_waits_then_gives_up(tmp_path: Path) -> None:
    clock = WallClock()
    store = MemoryMetadataStore(clock_ms=clock)
    dead = await store.open_node(node_id=NodeId(1), lease_ms=1000)
    stream_id = await store.create_stream(node_id=NodeId(1), node_epoch=dead.node_epoch)
    await store.open_stream(node_id=NodeId(1), node_epoch=dead.node_epoch, stream_id=stream_id, epoch=0)
    clock.ms += 2000  # its lease lapsed
    takeover = await store.start_takeover(
        node_id=NodeId(1), node_epoch=dead.node_epoch, taker_node_id=-1, taker_node_epoch=-1
    )
    assert takeover.state is TakeoverState.PENDING
    started = time.monotonic()
    with pytest.raises(UnavailableError) as refused:
        await open_client(
            tmp_path / "n1",
            config=CONFIG.replace(node_id=1, close_timeout_ms=300, cluster_poll_ms=20),
            metadata=store,
            storage=MemoryObjectStorage(),
        )
    assert refused.value.code == ErrorCode.NODE_TAKEOVER_IN_PROGRESS
    assert time.monotonic() - started >= 0.3
    assert not (tmp_path / "n1" / WAL_FILE).exists()  # the WAL the taker reads was never opened here
