"""The ``commit_objects`` contract on PostgreSQL."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from s3stream.metadata.postgres import PostgresMetadataStore
from tests.support.commit_objects_contract import CommitObjectsContract
from tests.support.metadata_contract import FakeClock


class TestPostgresCommitObjects(CommitObjectsContract):
    @pytest.fixture
    async def store(self, clock: FakeClock, pg_url: str) -> AsyncIterator[PostgresMetadataStore]:
        store = await PostgresMetadataStore.open(pg_url, clock_ms=clock)
        yield store
        await store.close()
