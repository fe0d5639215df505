"""The cluster part of the MetadataStore contract on SQLite, plus the schema's version 5: the
migration of a version-4 file, the read-only view, and the metadata copy leaving the cluster's
session state out."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from s3stream.errors import CorruptionError, InvalidArgumentError
from s3stream.ids import NodeId, StreamId
from s3stream.metadata import changelog, sqlite_copy, sqlite_schema
from s3stream.metadata.base import Assignment, NodeRuntime, TakeoverInfo, TakeoverState
from s3stream.metadata.changes import Change, PutAssignment, PutNodeRuntime, PutTakeover, RemoveAssignment
from s3stream.metadata.sqlite import SqliteMetadataStore
from s3stream.metadata.sqlite_readonly import ReadOnlySqliteStore
from tests.support.cluster_contract import LEASE_MS, ClusterContract, new_stream, session
from tests.support.metadata_contract import N1, N2, FakeClock


class TestSqliteClusterMetadata(ClusterContract):
    @pytest.fixture
    async def store(self, clock: FakeClock, tmp_path: Path) -> AsyncIterator[SqliteMetadataStore]:
        store = await SqliteMetadataStore.open(tmp_path / "meta.db", clock_ms=clock)
        yield store
        await store.close()


def test_the_cluster_changes_are_session_state_left_out_of_the_copy() -> None:
    takeover = TakeoverInfo(NodeId(1), 1, 2, "", (), TakeoverState.DONE, -1, -1, 0, 0, 0)
    cluster: list[Change] = [
        PutNodeRuntime(NodeRuntime(NodeId(1), "/w", -1, 0)),
        PutAssignment(Assignment(StreamId(0), NodeId(2), -1, 0)),
        RemoveAssignment(StreamId(0)),
        PutTakeover(takeover),
    ]
    assert sqlite_copy.copied_changes(cluster) == []
    assert all(isinstance(c, sqlite_copy.SESSION_CHANGES) for c in cluster)
    assert set(changelog.UNLOGGED) <= set(sqlite_copy.SESSION_CHANGES)


async def test_a_version_4_file_migrates_to_5_keeping_its_rows(tmp_path: Path, clock: FakeClock) -> None:
    path = tmp_path / "meta.db"
    conn = sqlite3.connect(path, isolation_level=None)
    sqlite_schema.migrate(conn, target_version=4)
    conn.execute("INSERT INTO nodes (node_id, node_epoch) VALUES (1, 3)")
    conn.execute(
        "INSERT INTO streams (stream_id, epoch, state, start_offset, end_offset, tags) VALUES (0, 0, 0, 0, 5, '{}')"
    )
    conn.close()
    store = await SqliteMetadataStore.open(path, clock_ms=clock)
    try:
        assert await store.schema_version() >= 5
        assert [(n.node_id, n.node_epoch) for n in await store.list_nodes()] == [(1, 3)]
        assert (await store.describe_stream(StreamId(0))).end_offset == 5
        assert await store.list_node_runtime() == []
        assert await store.list_assignments() == []
        assert await store.list_takeovers() == []
        a = await store.open_node(node_id=N1, lease_ms=LEASE_MS, wal_path="/w1")
        assert a.node_epoch == 4
    finally:
        await store.close()


async def test_a_changed_cluster_table_is_refused_as_damage(tmp_path: Path, clock: FakeClock) -> None:
    path = tmp_path / "meta.db"
    store = await SqliteMetadataStore.open(path, clock_ms=clock)
    await store.close()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("ALTER TABLE takeovers DROP COLUMN wal_end_offset")
    conn.close()
    with pytest.raises(CorruptionError, match="takeovers"):
        await SqliteMetadataStore.open(path, clock_ms=clock)


async def test_the_read_only_view_serves_the_cluster_listings(tmp_path: Path, clock: FakeClock) -> None:
    path = tmp_path / "meta.db"
    store = await SqliteMetadataStore.open(path, clock_ms=clock)
    try:
        a = await session(store, N1, "/w1")
        await session(store, N2)
        stream_id = await new_stream(store, a)
        await store.request_reassign(stream_ids=[stream_id], to_node_id=N2)
        clock.advance(LEASE_MS)
        b = await session(store, N2)
        await store.start_takeover(
            node_id=N1, node_epoch=a.node_epoch, taker_node_id=N2, taker_node_epoch=b.node_epoch
        )
        reader = await ReadOnlySqliteStore.open(path)
        try:
            assert await reader.list_node_runtime() == await store.list_node_runtime()
            assert await reader.list_assignments() == await store.list_assignments() != []
            assert await reader.list_takeovers() == await store.list_takeovers() != []
            with pytest.raises(InvalidArgumentError):
                await reader.request_reassign(stream_ids=[stream_id], to_node_id=N2)
        finally:
            await reader.close()
    finally:
        await store.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()
