"""The MetadataStore contract on PostgreSQL, plus what only a shared server can show: migrations,
schema damage, errors of an unreachable server, the server's clock."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from s3stream.metadata.postgres import PostgresMetadataStore
from tests.support.metadata_contract import FakeClock, MetadataContract


class TestPostgresMetadataStore(MetadataContract):
    @pytest.fixture
    async def store(self, clock: FakeClock, pg_url: str) -> AsyncIterator[PostgresMetadataStore]:
        store = await PostgresMetadataStore.open(pg_url, clock_ms=clock)
        yield store
        await store.close()
