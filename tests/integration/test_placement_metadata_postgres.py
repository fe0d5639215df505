"""The object-placement part of the MetadataStore contract on PostgreSQL (schema version 6)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import psycopg
import pytest

from s3stream.ids import ObjectId
from s3stream.metadata import postgres_schema
from s3stream.metadata.postgres import PostgresMetadataStore
from tests.support.metadata_contract import FakeClock
from tests.support.placement_contract import PlacementContract


class TestPostgresPlacement(PlacementContract):
    @pytest.fixture
    async def store(self, clock: FakeClock, pg_url: str) -> AsyncIterator[PostgresMetadataStore]:
        store = await PostgresMetadataStore.open(pg_url, clock_ms=clock)
        yield store
        await store.close()


async def test_a_version_5_schema_gets_the_placement_table(pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        assert postgres_schema.migrate(conn, target_version=5) == 0
        conn.execute(
            "INSERT INTO objects (object_id, state, size_bytes, prepared_at_ms, expires_at_ms, "
            "committed_at_ms, marked_at_ms, kind) VALUES (4, 2, 99, 0, 0, 1, -1, 1)"
        )
    store = await PostgresMetadataStore.open(pg_url, clock_ms=FakeClock())
    try:
        assert await store.schema_version() == 6
        assert await store.bucket_usage() == {0: (1, 99)}
        await store.record_placement(ObjectId(4), [1, 0])
        assert await store.placements([ObjectId(4)]) == {4: (0, 1)}
        assert await store.bucket_usage() == {0: (1, 99), 1: (1, 99)}
    finally:
        await store.close()
