"""The cluster part of the MetadataStore contract on the in-memory twin."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from s3stream.metadata.memory import MemoryMetadataStore
from tests.support.cluster_contract import ClusterContract
from tests.support.metadata_contract import FakeClock


class TestMemoryClusterMetadata(ClusterContract):
    @pytest.fixture
    async def store(self, clock: FakeClock) -> AsyncIterator[MemoryMetadataStore]:
        store = MemoryMetadataStore(clock_ms=clock)
        yield store
        await store.close()
