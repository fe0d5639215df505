"""The ``commit_objects`` contract on the in-memory twin and on SQLite."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from s3stream.metadata.changelog import decode_group
from s3stream.metadata.changes import (
    AdvanceEndOffsets,
    PutKv,
    PutObject,
    PutStreamObject,
    PutStreamSetObject,
    SetCounter,
)
from s3stream.metadata.memory import MemoryMetadataStore
from s3stream.metadata.sqlite import SqliteMetadataStore
from tests.support.commit_objects_contract import PROGRESS, CommitObjectsContract, request, so, sso
from tests.support.metadata_contract import TTL_MS, FakeClock, node, opened


class TestMemoryCommitObjects(CommitObjectsContract):
    @pytest.fixture
    async def store(self, clock: FakeClock) -> AsyncIterator[MemoryMetadataStore]:
        store = MemoryMetadataStore(clock_ms=clock)
        yield store
        await store.close()


class TestSqliteCommitObjects(CommitObjectsContract):
    @pytest.fixture
    async def store(self, clock: FakeClock, tmp_path: Path) -> AsyncIterator[SqliteMetadataStore]:
        store = await SqliteMetadataStore.open(tmp_path / "meta.db", clock_ms=clock)
        yield store
        await store.close()


async def test_an_external_commit_is_one_group_of_the_metadata_copy_log(tmp_path: Path) -> None:
    store = await SqliteMetadataStore.open(tmp_path / "m.db", clock_ms=FakeClock())
    try:
        await node(store)
        s0 = await opened(store)
        first = await store.prepare_objects(count=3, ttl_ms=TTL_MS)
        await store.copy_enable()
        await store.commit_objects(
            request(
                [sso(first, (s0, 0, 5)), so(first + 1, s0, 5, 9)],
                {s0: 0},
                puts={PROGRESS: b"1"},
                release=[first + 2],
            )
        )
    finally:
        await store.close()
    conn = sqlite3.connect(tmp_path / "m.db")
    try:
        rows = conn.execute("SELECT payload FROM pending_copy ORDER BY seq").fetchall()
    finally:
        conn.close()
    assert len(rows) == 1
    kinds = {type(c) for c in decode_group(rows[0][0], source="r").changes}
    assert kinds == {PutObject, PutStreamSetObject, PutStreamObject, AdvanceEndOffsets, SetCounter, PutKv}
