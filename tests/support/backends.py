"""Backend matrix for the engine suites: re-run their tests with real object storage and SQLite.

The engine's API suite (``tests.unit.test_engine``) builds every engine through its ``Node`` helper,
which looks up ``MemoryObjectStorage`` and ``MemoryMetadataStore`` in the suite's module namespace at
call time. A backend module re-exports the suite's ``test_*`` functions (:func:`export_suite`) and
patches those two names with the factories of a :class:`Backend` for the duration of each test
(:func:`patch_suite`). The stateful test's machine is subclassed (:func:`backend_machine`) so each
hypothesis example gets a fresh backend of its own. Suite tests that assume the twin's timing are
left out by name and run as waiting variants (:data:`WAITING_VARIANTS`); a name the suite drops
fails the import, so nothing is left out silently.

The WAL stays the in-memory twin: the suite observes it through twin-only attributes (``records``,
``append_count``, and ``fail_next``, ``gate`` of :class:`~tests.support.wal.FaultyMemoryWal`); the
real block WAL on a file is covered by ``tests/unit/test_engine_embedded.py`` and the crash tests.

Isolation: every storage a backend hands out lives under its own directory or key prefix, every
metadata store is its own SQLite file or, for a PostgreSQL backend (``metadata_kind="postgresql"``),
its own fresh schema on the server of ``S3STREAM_TEST_PG_URL`` (the test fails without it), and
:meth:`Backend.aclose` closes them all (deletes the S3 objects, drops the schemas) when the test ends.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import types
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest

from s3stream.metadata.base import MetadataStore
from s3stream.metadata.sqlite import SqliteMetadataStore
from s3stream.storage.base import ObjectStorage
from s3stream.storage.local import LocalObjectStorage
from s3stream.storage.s3 import S3ObjectStorage
from s3stream.storage.uri import open_storage
from tests.property.test_engine_stateful import EngineMachine
from tests.support.metadata_urls import MetadataKind, open_store
from tests.support.postgres import fresh_schema
from tests.support.s3 import S3TestServer

METADATA_POOL_COUNT = 2
"""Metadata stores opened ahead per test: ``Node`` builds its metadata synchronously, the stores open
asynchronously. Every suite test today builds at most one store (extra nodes share the first)."""


class Backend:
    """Hands out real object storages and metadata stores (SQLite files or PostgreSQL schemas);
    closes them all in :meth:`aclose`."""

    def __init__(
        self,
        name: str,
        root: Path,
        s3: S3TestServer | None = None,
        s3_prefix: str = "",
        *,
        metadata_kind: MetadataKind = "sqlite",
    ) -> None:
        assert (name == "s3") == (s3 is not None), "the s3 backend needs a server, the others none"
        self.name = name
        self.root = root
        self.s3 = s3
        self.s3_prefix = s3_prefix
        self.metadata_kind = metadata_kind
        self.storages: list[ObjectStorage] = []
        self.metadata_ready: list[MetadataStore] = []
        self.metadata_used: list[MetadataStore] = []
        self.metadata_urls: list[str] = []
        self._schemas = ExitStack()
        """Drops the PostgreSQL schemas when closed."""

    def __repr__(self) -> str:
        where = f"s3 prefix {self.s3_prefix!r}" if self.s3 else f"root {self.root}"
        urls = ", ".join(self.metadata_urls)
        return f"Backend({self.name}, {where}, {self.metadata_kind} metadata {urls})"

    def new_storage(self, *args: object) -> ObjectStorage:
        """A fresh, empty object storage (its own directory or key prefix)."""
        assert not args, f"the suite passed arguments to its storage factory: {args!r}"
        index = len(self.storages)
        storage: ObjectStorage
        if self.s3 is None:
            storage = LocalObjectStorage(self.root / f"objects-{index}")
        else:
            storage = open_storage(self.s3.uri(f"{self.s3_prefix}{index}/"))
        self.storages.append(storage)
        return storage

    async def open_metadata(self, count: int = METADATA_POOL_COUNT) -> None:
        """Open ``count`` stores ahead for :meth:`take_metadata`: SQLite files under the root, or
        fresh PostgreSQL schemas."""
        for _ in range(count):
            index = len(self.metadata_ready) + len(self.metadata_used)
            if self.metadata_kind == "sqlite":
                store: MetadataStore = await SqliteMetadataStore.open(self.root / f"metadata-{index}.db")
            else:
                url = self._schemas.enter_context(fresh_schema())
                self.metadata_urls.append(url.rsplit("search_path%3D", 1)[-1])
                store = await open_store(url)
            self.metadata_ready.append(store)

    def take_metadata(self, *args: object) -> MetadataStore:
        """One of the stores opened ahead (``Node`` builds metadata synchronously)."""
        assert not args, f"the suite passed arguments to its metadata factory: {args!r}"
        if not self.metadata_ready:
            raise RuntimeError(
                f"{self!r}: the test builds more than {len(self.metadata_used)} metadata stores; "
                "raise METADATA_POOL_COUNT in tests/support/backends.py"
            )
        store = self.metadata_ready.pop(0)
        self.metadata_used.append(store)
        return store

    async def aclose(self) -> None:
        """Close every store handed out and drop the schemas; delete what the test left in S3."""
        try:
            for metadata in self.metadata_used + self.metadata_ready:
                await metadata.close()
        finally:
            self._schemas.close()
        for storage in self.storages:
            if isinstance(storage, S3ObjectStorage):
                keys = [info.key async for info in storage.list("")]
                if keys:
                    await storage.delete(keys)
                await storage.abort_incomplete_uploads(older_than_s=-60.0)  # every one, skew or not
            await storage.close()


def export_suite(suite: types.ModuleType, left_out: dict[str, str]) -> dict[str, Any]:
    """The suite's ``test_*`` functions minus ``left_out`` (name -> reason), to put in ``globals()``.

    A ``left_out`` name the suite no longer has is an error, so the exclusion list cannot go stale.
    """
    tests = {name: fn for name, fn in vars(suite).items() if name.startswith("test_") and callable(fn)}
    stale = set(left_out) - set(tests)
    if stale:
        raise RuntimeError(f"left-out entries name tests {suite.__name__} no longer has: {sorted(stale)}")
    assert all(reason.strip() for reason in left_out.values()), "every left-out test needs a reason"
    return {name: fn for name, fn in tests.items() if name not in left_out}


def is_suite_test(request: pytest.FixtureRequest, suite: types.ModuleType) -> bool:
    """Whether the running test is one of ``suite``'s re-exported functions."""
    function = getattr(request.node, "function", None)
    return getattr(function, "__module__", None) == suite.__name__


@contextmanager
def patch_suite(monkeypatch: pytest.MonkeyPatch, suite: types.ModuleType, backend: Backend) -> Iterator[None]:
    """Make the suite's ``Node`` build its storage and metadata on ``backend`` while inside."""
    monkeypatch.setattr(suite, "MemoryObjectStorage", backend.new_storage)
    monkeypatch.setattr(suite, "MemoryMetadataStore", backend.take_metadata)
    print(f"engine suite on {backend!r}")  # shown with a failure: which backend, where its data is
    yield


def check_suite_builds_on(suite: types.ModuleType, storage_type: type, metadata_type: type) -> None:
    """The suite's ``Node`` really builds on the backend: guards against a renamed import in the
    suite silently putting the matrix back on the twins."""
    node = suite.Node()
    assert isinstance(node.storage, storage_type), node.storage
    assert isinstance(node.metadata, metadata_type), node.metadata


def backend_machine(make_backend: Callable[[Path], Backend]) -> type[EngineMachine]:
    """The stateful machine with a fresh ``make_backend(tmp_dir)`` backend per hypothesis example."""

    class BackendMachine(EngineMachine):
        def __init__(self) -> None:
            super().__init__()  # builds twins first; the storage and metadata are replaced below
            self.tmp_dir = Path(tempfile.mkdtemp(prefix="s3stream-engine-matrix-"))
            self.backend = make_backend(self.tmp_dir)
            # EngineMachine annotates these as the twins; the machine only uses the protocols.
            self.storage = self.backend.new_storage()  # type: ignore[assignment]
            self.run(self.backend.open_metadata(1))
            self.metadata = self.backend.take_metadata()  # type: ignore[assignment]

        def teardown(self) -> None:
            try:
                if self.client is not None:
                    self.run(self.client.close())
                    self.client = None
                self.run(self.backend.aclose())
            finally:
                shutil.rmtree(self.tmp_dir, ignore_errors=True)
                super().teardown()

    return BackendMachine


def s3_backend_factory(server: S3TestServer, prefix: str) -> Callable[[Path], Backend]:
    """Backends on ``server``, each under a fresh sub-prefix of ``prefix``."""

    def make(root: Path) -> Backend:
        return Backend("s3", root, server, f"{prefix}{uuid.uuid4().hex[:8]}/")

    return make


async def check_full_cache_gives_capacity_error_when_storage_is_down(suite: types.ModuleType) -> None:
    """The suite's outage test, waiting for the first failed upload instead of assuming it came first.

    On the twin an upload fails before the cache fills; on a real backend the failing upload is
    still writing its body when the appends fill the cache, so the retry shows up a little later.
    """
    from s3stream.errors import CapacityError, UnavailableError
    from s3stream.model import RecordBatch
    from s3stream.storage.base import Upload

    kib = 1024
    node = suite.Node(
        suite.SMALL.replace(wal_cache_size_bytes=1024 * kib, wal_upload_threshold_bytes=256 * kib)
    )
    client = await node.open()
    stream = await client.streams.create_and_open_stream()
    real_upload = node.storage.upload

    def down(key: str) -> Upload:
        upload: Upload = real_upload(key)

        async def fail() -> int:
            raise UnavailableError("storage down")

        upload.complete = fail  # type: ignore[method-assign]
        return upload

    node.storage.upload = down
    acked = 0
    rejected = None
    for _ in range(200):
        try:
            await stream.append(RecordBatch(b"z" * (20 * kib)))
        except CapacityError as exc:
            rejected = exc
            break
        acked += 1
    assert rejected is not None
    assert rejected.retriable
    assert 20 <= acked < 200
    for _ in range(500):
        if client.engine.stats.upload_retries:
            break
        await asyncio.sleep(0.01)
    assert client.engine.stats.upload_retries > 0
    del node.storage.upload  # storage back
    await client.engine.force_upload(None)
    assert len(await stream.fetch(0, acked, max_bytes=1 << 30)) == acked
    await client.close()


async def check_interval_trigger_uploads_an_old_active_block(suite: types.ModuleType) -> None:
    """The suite's interval test, waiting for the WAL trim that follows the commit.

    The trim is a task spawned after the commit; on the twin it has run by the time the test sees
    the upload counted, on a real backend the commit completes from an I/O callback and the test
    can look in between.
    """
    from s3stream.model import RecordBatch

    node = suite.Node(suite.SMALL.replace(wal_upload_interval_ms=100))
    client = await node.open()
    stream = await client.streams.create_and_open_stream()
    await stream.append(RecordBatch(b"tick"))
    assert client.engine.stats.uploads == 0
    for _ in range(250):
        await asyncio.sleep(0.02)
        if client.engine.stats.uploads and not node.wal.records:
            break
    assert client.engine.stats.uploads == 1
    assert node.wal.records == {}
    await client.close()


WAITING_VARIANTS: dict[str, tuple[str, Callable[[types.ModuleType], Awaitable[None]]]] = {
    "test_full_cache_gives_capacity_error_when_storage_is_down": (
        "asserts an upload retry right when the cache fills; on real storage the failing upload is "
        "often still writing then",
        check_full_cache_gives_capacity_error_when_storage_is_down,
    ),
    "test_interval_trigger_uploads_an_old_active_block": (
        "asserts the WAL is trimmed as soon as the upload is counted; the trim is a task spawned "
        "after the commit, which on real storage completes from an I/O callback",
        check_interval_trigger_uploads_an_old_active_block,
    ),
}
"""Suite tests that assume the twin's timing, name -> (reason, variant). They are not re-run as they
are; each backend module runs the variant instead (same steps and assertions, but waiting for the
asynchronous effect), as ``<name>_waiting``. Drop an entry once the suite itself waits."""


def waiting_variant_tests(suite: types.ModuleType, backend_fixture: str) -> dict[str, Any]:
    """The :data:`WAITING_VARIANTS` as test functions using ``backend_fixture``, to put in ``globals()``."""
    tests: dict[str, Any] = {}

    def make(check: Callable[[types.ModuleType], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
        async def variant() -> None:
            await check(suite)

        return variant

    for name, (_, check) in WAITING_VARIANTS.items():
        variant = make(check)
        variant.__name__ = variant.__qualname__ = f"{name}_waiting"
        tests[variant.__name__] = pytest.mark.usefixtures(backend_fixture)(variant)
    return tests
