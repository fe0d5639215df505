"""The storage contract on the local filesystem store, plus what only a filesystem can show."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from s3stream._loop import run
from s3stream.errors import ClosedError, ConflictError, NotFoundError
from s3stream.storage.local import UPLOAD_BUFFER_MAX_BYTES, LocalObjectStorage, _LocalUpload
from tests.support.storage_contract import LIST_PAGE_SIZE, StorageContract, keys_of


@pytest.fixture
async def storage(tmp_path: Path) -> AsyncIterator[LocalObjectStorage]:
    store = LocalObjectStorage(tmp_path / "root", list_page_size=LIST_PAGE_SIZE)
    yield store
    await store.close()


class TestLocalContract(StorageContract):
    pass


def all_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


async def test_objects_are_plain_files_under_the_root(storage: LocalObjectStorage) -> None:
    await storage.put("7a3f0000/0/123", b"hello")
    assert (storage.root / "7a3f0000" / "0" / "123").read_bytes() == b"hello"


async def test_no_temporary_files_remain_after_writes_and_aborts(storage: LocalObjectStorage) -> None:
    await storage.put("a/b", b"1")
    with pytest.raises(ConflictError):
        await storage.put("a/b", b"2", if_absent=True)
    upload = storage.upload("a/c")
    await upload.write(b"x" * (9 * 1024 * 1024))  # large enough to reach the disk before complete
    await upload.abort()
    failed = storage.upload("a/d")
    await failed.write(b"x")
    with pytest.raises(NotFoundError):
        await failed.copy("missing", 0, 1)
    assert all_files(storage.root) == ["a", "a/b"]


async def test_a_cancelled_upload_step_finishes_on_its_disk_thread_before_abort_cleans_up(
    storage: LocalObjectStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: abort used to run beside the step still on its thread (closing its fd, leaking its file)."""
    events: list[str] = []
    release = threading.Event()
    flush, discard = _LocalUpload._flush_sync, _LocalUpload._discard_sync

    def slow_flush(self: _LocalUpload, chunks: list[bytes | bytearray | memoryview]) -> None:
        events.append("flush started")
        release.wait(10)
        flush(self, chunks)
        events.append("flush done")

    def recorded_discard(self: _LocalUpload) -> None:
        events.append("discard")
        discard(self)

    monkeypatch.setattr(_LocalUpload, "_flush_sync", slow_flush)
    monkeypatch.setattr(_LocalUpload, "_discard_sync", recorded_discard)
    upload = storage.upload("a/k")
    write = asyncio.create_task(upload.write(bytes(UPLOAD_BUFFER_MAX_BYTES)))
    while not events:
        await asyncio.sleep(0.001)
    write.cancel()
    await asyncio.sleep(0.05)
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await write
    assert events == ["flush started", "flush done", "discard"]
    assert all_files(storage.root) == ["a"]


async def test_close_waits_for_running_disk_work_without_blocking_the_loop(
    storage: LocalObjectStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: close() joined the disk threads on the event loop, freezing it meanwhile."""
    real_put = LocalObjectStorage._put_sync

    def slow_put(self: LocalObjectStorage, key: str, data: bytes, if_absent: bool) -> None:
        time.sleep(0.3)
        real_put(self, key, data, if_absent)

    monkeypatch.setattr(LocalObjectStorage, "_put_sync", slow_put)
    put = asyncio.ensure_future(storage.put("k", b"v"))
    await asyncio.sleep(0.05)  # the put is on its disk thread
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.01)

    ticker = asyncio.ensure_future(tick())
    await storage.close()
    ticker.cancel()
    await put  # it finished before close returned
    assert (storage.root / "k").read_bytes() == b"v"
    assert ticks >= 5


async def test_stale_temporary_files_are_swept(storage: LocalObjectStorage) -> None:
    await storage.put("dir/obj", b"1")
    stale = storage.root / "dir" / ".obj~0123"
    fresh = storage.root / "dir" / ".obj~4567"
    stale.write_bytes(b"old")
    fresh.write_bytes(b"new")
    os.utime(stale, (0, 0))
    assert await storage.remove_stale_temp_files(older_than_s=60) == 1
    assert all_files(storage.root) == ["dir", "dir/.obj~4567", "dir/obj"]


async def test_deleting_the_last_object_removes_empty_directories(storage: LocalObjectStorage) -> None:
    await storage.put("x/y/z", b"1")
    await storage.put("x/w", b"1")
    await storage.delete(["x/y/z"])
    assert all_files(storage.root) == ["x", "x/w"]
    await storage.delete(["x/w"])
    assert all_files(storage.root) == []


async def test_a_key_cannot_be_object_and_directory(storage: LocalObjectStorage) -> None:
    await storage.put("a/b", b"1")
    with pytest.raises(ConflictError):
        await storage.put("a", b"2")
    with pytest.raises(ConflictError):
        await storage.put("a/b/c", b"3")
    with pytest.raises(NotFoundError):
        await storage.get("a")
    with pytest.raises(NotFoundError):
        await storage.head("a/b/c")
    assert await keys_of(storage) == ["a/b"]


async def test_stray_temporary_files_are_not_listed(storage: LocalObjectStorage) -> None:
    await storage.put("dir/obj", b"1")
    (storage.root / "dir" / ".obj~deadbeef").write_bytes(b"partial")
    assert await keys_of(storage) == ["dir/obj"]


async def test_symlink_components_cannot_escape_by_key(tmp_path: Path) -> None:
    # Keys are validated, so the only way out would be a link placed by someone else; reads of
    # keys that name directories or links to directories are NotFound, never a directory listing.
    store = LocalObjectStorage(tmp_path / "root")
    await store.put("inside/x", b"1")
    with pytest.raises(NotFoundError):
        await store.get("inside")
    await store.close()


async def test_concurrent_puts_and_deletes_in_one_directory_never_fail(storage: LocalObjectStorage) -> None:
    async def churn(i: int) -> None:
        for round_ in range(20):
            key = f"hot/dir/{i}-{round_}"
            await storage.put(key, b"v")
            await storage.delete([key])

    await asyncio.gather(*(churn(i) for i in range(8)))
    assert await keys_of(storage) == []


async def test_closed_store_rejects_calls(tmp_path: Path) -> None:
    store = LocalObjectStorage(tmp_path)
    await store.close()
    with pytest.raises(ClosedError):
        await store.put("a", b"1")


def _race_writer(root: str, index: int, start: multiprocessing.synchronize.Event) -> bool:
    store = LocalObjectStorage(root)
    start.wait()

    async def attempt() -> bool:
        try:
            await store.put("lease", f"process-{index}".encode(), if_absent=True)
        except ConflictError:
            return False
        finally:
            await store.close()
        return True

    return run(attempt())


def test_conditional_create_is_exact_across_processes(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Manager().Event()
    with ctx.Pool(6) as pool:
        pending = [pool.apply_async(_race_writer, (str(tmp_path), i, start)) for i in range(6)]
        start.set()
        results = [p.get(timeout=60) for p in pending]
    assert results.count(True) == 1
    winner = results.index(True)
    assert (tmp_path / "lease").read_bytes() == f"process-{winner}".encode()
    assert os.listdir(tmp_path) == ["lease"]


async def test_a_large_mutable_part_is_written_without_a_copy_on_the_event_loop(
    storage: LocalObjectStorage,
) -> None:
    import tracemalloc

    part_bytes = 16 * 1024 * 1024
    part = bytearray(os.urandom(1024) * (part_bytes // 1024))
    expected = bytes(part)
    upload = storage.upload("big/part")
    tracemalloc.start()
    try:
        await upload.write(part)
        _, peak_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak_bytes < part_bytes // 8  # before: a private 16 MiB copy made on the loop
    part[:4] = b"XXXX"  # the caller reuses its buffer once write returns
    small = bytearray(b"tail")
    await upload.write(small)
    small[:] = b"YYYY"
    assert await upload.complete() == part_bytes + 4
    assert await storage.get("big/part") == expected + b"tail"


async def test_a_put_retries_when_a_delete_prunes_a_parent_between_its_mkdirs(
    storage: LocalObjectStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_mkdir = os.mkdir
    pruned: list[str] = []

    def mkdir_after_a_concurrent_prune(path: str | os.PathLike[str], *args: object, **kwargs: object) -> None:
        if str(path).endswith("hot/dir") and not pruned:
            pruned.append(str(path))
            os.rmdir(os.path.dirname(path))  # the last object of "hot" was just deleted
        real_mkdir(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "mkdir", mkdir_after_a_concurrent_prune)
    await storage.put("hot/dir/obj", b"x")
    assert pruned
    assert await storage.get("hot/dir/obj") == b"x"


async def test_a_directory_pruned_between_mkdir_and_the_check_is_made_again(
    storage: LocalObjectStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The race seen under load: put's mkdir finds the directory (FileExistsError), then a concurrent
    # delete prunes it before put checks what is there. That is not an object in the way: make it again.
    import s3stream.storage.local as local_module

    real_mkdir = os.mkdir
    raced: list[str] = []

    def mkdir_losing_one_race(path: str | os.PathLike[str], *args: object) -> None:
        if str(path).endswith("/racy") and not raced:
            raced.append(str(path))
            raise FileExistsError(path)  # it "existed", and is gone by the time put looks
        real_mkdir(path, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(local_module.os, "mkdir", mkdir_losing_one_race)
    await storage.put("racy/key", b"v")
    assert raced
    assert await storage.get("racy/key") == b"v"


async def test_a_directory_pruned_and_made_again_between_two_looks_is_not_an_object(
    storage: LocalObjectStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The race seen in CI: put's mkdir finds the directory, a concurrent delete prunes it and a
    # concurrent put makes it again while put looks at what is there. Looking twice (is it a
    # directory? does anything exist?) saw "not a directory" and then "something", and reported an
    # object in the way. A directory is there: the put goes on.
    import s3stream.storage.local as local_module

    real_mkdir = os.mkdir
    real_is_dir = Path.is_dir
    raced: list[str] = []

    def mkdir_after_a_racer(path: str | os.PathLike[str], *args: object) -> None:
        if str(path).endswith("/twice") and not raced:
            raced.append(str(path))
            real_mkdir(path, *args)  # type: ignore[arg-type]  # the concurrent put made it first
            raise FileExistsError(path)
        real_mkdir(path, *args)  # type: ignore[arg-type]

    def is_dir_missing_it_once(self: Path) -> bool:
        if str(self).endswith("/twice") and len(raced) == 1:
            raced.append("looked")
            return False  # pruned at this look, made again before the next one
        return real_is_dir(self)

    monkeypatch.setattr(local_module.os, "mkdir", mkdir_after_a_racer)
    monkeypatch.setattr(Path, "is_dir", is_dir_missing_it_once)
    await storage.put("twice/key", b"v")
    assert raced[:1] == [str(storage.root / "twice")]
    assert await storage.get("twice/key") == b"v"
