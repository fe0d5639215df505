"""The cluster's coordination state and the metadata copy: never in the change log, emptied by a
restore (a snapshot's rows describe the moment of the snapshot), and `restore` still rebuilds the
data tables of a database that has them."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from s3stream.ids import NodeId
from s3stream.metacopy.replicator import MetadataCopy
from s3stream.metacopy.restore import restore
from s3stream.metadata import changelog, cluster_schema
from s3stream.metadata.base import StreamState, TakeoverState
from s3stream.metadata.sqlite import SqliteMetadataStore
from s3stream.storage.memory import MemoryObjectStorage
from tests.support.cluster_contract import LEASE_MS, commit, new_stream, session
from tests.support.metadata_contract import FakeClock

NS = "ns"
N1, N2, N3 = NodeId(1), NodeId(2), NodeId(3)


def rows(path: Path, table: str) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(f"SELECT * FROM {table}").fetchall()
    finally:
        conn.close()


async def test_cluster_operations_log_only_their_stream_changes(tmp_path: Path) -> None:
    clock = FakeClock()
    store = await SqliteMetadataStore.open(tmp_path / "metadata.db", clock_ms=clock)
    try:
        await store.copy_enable()
        a, b = await session(store, N1, "/w1"), await session(store, N2)
        stream_id = await new_stream(store, a)
        logged_before = len(await store.copy_pending(bytes_max=1 << 30))
        await store.heartbeat(node_id=N1, node_epoch=a.node_epoch, lease_ms=LEASE_MS, wal_pending_bytes=9)
        await store.request_reassign(stream_ids=[stream_id], to_node_id=N2)
        clock.advance(LEASE_MS)
        b = await session(store, N2)
        await store.start_takeover(
            node_id=N1, node_epoch=a.node_epoch, taker_node_id=N2, taker_node_epoch=b.node_epoch
        )
        assert len(await store.copy_pending(bytes_max=1 << 30)) == logged_before, "nothing logged"
        await store.takeover_streams(node_id=N1, taker_node_id=N2, taker_node_epoch=b.node_epoch)
        await store.finish_takeover(
            node_id=N1, taker_node_id=N2, taker_node_epoch=b.node_epoch, wal_end_offset=0
        )
        pending = await store.copy_pending(bytes_max=1 << 30)
        assert len(pending) == logged_before + 2, "the takeover's stream changes are logged"
        for _, payload in pending:
            for change in changelog.decode_group(payload, source="test").changes:
                assert not isinstance(change, changelog.UNLOGGED)
    finally:
        await store.close()


async def test_restore_rebuilds_the_streams_and_empties_the_cluster_tables(tmp_path: Path) -> None:
    clock = FakeClock()
    (tmp_path / "a").mkdir()
    source = tmp_path / "a" / "metadata.db"
    store = await SqliteMetadataStore.open(source, clock_ms=clock)
    storage = MemoryObjectStorage()
    try:
        a = await session(store, N1, "/w1")
        await session(store, N2)
        moving = await new_stream(store, a)
        await commit(store, a, moving, 0, 10)
        await store.request_reassign(stream_ids=[moving], to_node_id=N2)
        clock.advance(LEASE_MS)
        c = await session(store, N3)
        await store.start_takeover(
            node_id=N1, node_epoch=a.node_epoch, taker_node_id=N3, taker_node_epoch=c.node_epoch
        )
        copy = MetadataCopy(store, storage, namespace=NS)
        await copy.start()  # its first snapshot holds the in-flight takeover and the rows above
        try:
            for _ in range(500):
                if copy.copied_seq >= 0:
                    break
                await asyncio.sleep(0.01)
            await store.takeover_streams(node_id=N1, taker_node_id=N3, taker_node_epoch=c.node_epoch)
            await commit(store, c, moving, 10, 25)
            await store.finish_takeover(
                node_id=N1, taker_node_id=N3, taker_node_epoch=c.node_epoch, wal_end_offset=0
            )
        finally:
            await copy.close()
        assert rows(source, "takeovers") != []
    finally:
        await store.close()
    await restore(storage, namespace=NS, data_dir=tmp_path / "b", kv_overrides={})
    target = tmp_path / "b" / "metadata.db"
    for table in cluster_schema.CLUSTER_TABLES:
        assert rows(target, table) == [], table
    restored = await SqliteMetadataStore.open(target, clock_ms=clock)
    try:
        (stream,) = await restored.list_streams()
        assert (stream.state, stream.end_offset, stream.ranges[-1].node_id) == (StreamState.CLOSED, 25, N3)
        assert await restored.list_takeovers() == []
        again = await session(restored, N1)  # not held back by the snapshot's in-flight takeover
        assert again.node_epoch > a.node_epoch
        assert TakeoverState.DONE not in {t.state for t in await restored.list_takeovers()}
    finally:
        await restored.close()
