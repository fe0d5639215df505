"""The storage contract on the in-memory twin, plus its request counters."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from s3stream.errors import ClosedError, InvalidArgumentError
from s3stream.storage.memory import MemoryObjectStorage
from tests.support.storage_contract import LIST_PAGE_SIZE, StorageContract


@pytest.fixture
async def storage() -> AsyncIterator[MemoryObjectStorage]:
    store = MemoryObjectStorage("contract", list_page_size=LIST_PAGE_SIZE)
    yield store
    await store.close()


class TestMemoryContract(StorageContract):
    pass


async def test_counters_track_requests_and_bytes() -> None:
    store = MemoryObjectStorage(list_page_size=2)
    await store.put("a", b"12345")
    await store.put("b", b"1")
    await store.put("c", b"1")
    assert await store.get("a", 1, 3) == b"23"
    await store.head("a")
    upload = store.upload("d")
    await upload.copy("a", 0, 5)
    await upload.complete()
    assert [i.key async for i in store.list()] == ["a", "b", "c", "d"]
    await store.delete([f"x{i}" for i in range(2500)])
    assert store.stats.counts == {"put": 4, "get": 1, "head": 1, "copy": 1, "list": 3, "delete": 3}
    assert store.stats.bytes == {"put": 12, "get": 2, "copy": 5}
    store.stats.reset()
    assert not store.stats.counts


async def test_closed_store_rejects_calls() -> None:
    store = MemoryObjectStorage()
    await store.close()
    with pytest.raises(ClosedError):
        await store.put("a", b"")
    with pytest.raises(ClosedError):
        await store.get("a")


def test_page_size_must_be_positive() -> None:
    with pytest.raises(InvalidArgumentError):
        MemoryObjectStorage(list_page_size=0)
