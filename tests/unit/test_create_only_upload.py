"""Create-only streamed uploads (``upload(key, if_absent=True)``) on the local and in-memory stores: the
first complete publishes, a later one raises ConflictError and leaves the object as it was."""

from __future__ import annotations

from pathlib import Path

import pytest

from s3stream.errors import ConflictError
from s3stream.storage.local import LocalObjectStorage
from s3stream.storage.memory import MemoryObjectStorage


@pytest.fixture(params=["local", "memory"])
async def storage(request: pytest.FixtureRequest, tmp_path: Path) -> LocalObjectStorage | MemoryObjectStorage:
    if request.param == "local":
        return LocalObjectStorage(str(tmp_path / "objects"))
    return MemoryObjectStorage("create-only")


async def test_a_create_only_upload_never_replaces_an_object(
    storage: LocalObjectStorage | MemoryObjectStorage,
) -> None:
    first = storage.upload("a/b", if_absent=True)
    await first.write(b"first")
    assert await first.complete() == 5
    second = storage.upload("a/b", if_absent=True)
    await second.write(b"second")
    with pytest.raises(ConflictError):
        await second.complete()
    await second.abort()
    assert await storage.get("a/b") == b"first"
    plain = storage.upload("a/b")  # without the condition the key is replaced, as before
    await plain.write(b"third")
    await plain.complete()
    assert await storage.get("a/b") == b"third"
    await storage.close()
