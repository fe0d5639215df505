"""The object-placement part of the MetadataStore contract on the in-memory twin and on SQLite, plus
SQLite's version 6: a version-5 file migrates keeping its rows, and placements reach the metadata
copy's change log."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from s3stream.ids import ObjectId
from s3stream.metadata import sqlite_copy, sqlite_schema
from s3stream.metadata.changes import Change, PutPlacement, RemovePlacements
from s3stream.metadata.memory import MemoryMetadataStore
from s3stream.metadata.sqlite import SqliteMetadataStore
from tests.support.metadata_contract import FakeClock
from tests.support.placement_contract import PlacementContract


class TestMemoryPlacement(PlacementContract):
    @pytest.fixture
    async def store(self, clock: FakeClock) -> AsyncIterator[MemoryMetadataStore]:
        store = MemoryMetadataStore(clock_ms=clock)
        yield store
        await store.close()


class TestSqlitePlacement(PlacementContract):
    @pytest.fixture
    async def store(self, clock: FakeClock, tmp_path: Path) -> AsyncIterator[SqliteMetadataStore]:
        store = await SqliteMetadataStore.open(tmp_path / "meta.db", clock_ms=clock)
        yield store
        await store.close()


async def test_a_version_5_file_migrates_to_6_keeping_its_objects(tmp_path: Path) -> None:
    path = tmp_path / "meta.db"
    conn = sqlite3.connect(path, isolation_level=None)
    sqlite_schema.migrate(conn, target_version=5)
    conn.execute(
        "INSERT INTO objects (object_id, state, size_bytes, prepared_at_ms, expires_at_ms, committed_at_ms, "
        "marked_at_ms, kind) VALUES (4, 2, 99, 0, 0, 1, -1, 1)"
    )
    conn.close()
    store = await SqliteMetadataStore.open(path, clock_ms=FakeClock())
    try:
        assert await store.schema_version() == 6
        assert await store.placements([ObjectId(4)]) == {}
        assert await store.bucket_usage() == {0: (1, 99)}
        await store.record_placement(ObjectId(4), [3])
        assert await store.bucket_usage() == {3: (1, 99)}
    finally:
        await store.close()


def test_placement_changes_are_copied_to_the_bucket() -> None:
    changes: list[Change] = [PutPlacement(ObjectId(1), 2), RemovePlacements(ObjectId(1))]
    assert sqlite_copy.copied_changes(changes) == changes
