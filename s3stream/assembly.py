"""The one module that wires the WAL, metadata, object storage, read path and engine together.

``open_client(data_dir, bucket_uri=None, config=None)`` builds the embedded default:
``<data_dir>/wal`` (the block WAL, preallocated), ``<data_dir>/objects`` (local object storage),
``<data_dir>/metadata.db`` (SQLite). A ``bucket_uri`` (``0@s3://bucket?endpoint=..``, ``file:///path``,
``mem://name``) puts objects there instead. Components start in dependency order and close in
reverse; the :class:`PreparedObjectReaper` (expiry of prepared objects left by crashed uploads and
deletion of their bytes) and the :class:`~compaction.compactor.Compactor` are background components of
the client. ``open_sync`` is the same behind the blocking facade. It is the top of the package:
``s3stream.open`` / ``s3stream.open_sync`` are these functions, and nothing in the engine, the facade,
the storage or the metadata layers imports this module (``tests/unit/test_engine_layering.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

from compaction.compactor import Compactor
from s3stream.config import Config
from s3stream.engine.blockcache import BlockCache
from s3stream.engine.client import RESERVED_KV_PREFIX, Client
from s3stream.engine.core import Engine, UploadObserver
from s3stream.engine.reader import ObjectStreamReader
from s3stream.engine.walport import BodyParts, WriteAheadLog
from s3stream.errors import (
    CapacityError,
    ClosedError,
    ConflictError,
    CorruptionError,
    FencedError,
    InvalidArgumentError,
    S3StreamError,
    UnavailableError,
)
from s3stream.facade import SyncClient
from s3stream.ids import NodeId, ObjectId
from s3stream.metadata.base import MetadataStore
from s3stream.objectformat import ObjectReaderCache, object_key, parse_object_key
from s3stream.storage.base import MAX_DELETE_BATCH, ObjectStorage
from wal import BlockWAL, WalConfig
from wal import errors as walerr
from wal.config import IO_THREADS_MAX

log = logging.getLogger(__name__)

REAPER_PERIOD_S = 1.0
"""How often expired prepared objects and destroyable objects are looked for (AutoMQ: 1 s)."""
READER_CACHE_BYTES = 16 * 1024 * 1024
"""Object index cache of the read path."""


def build_reader(config: Config, metadata: MetadataStore, storage: ObjectStorage) -> ObjectStreamReader:
    """The object read path (block cache + index cache + readahead) for the engine."""
    return ObjectStreamReader(
        metadata,
        storage,
        namespace=config.namespace,
        block_cache=BlockCache(config.block_cache_size_bytes),
        reader_cache=ObjectReaderCache(storage, capacity_bytes=READER_CACHE_BYTES),
    )


def node_epoch_now() -> int:
    """A node epoch: the start time in ms (AutoMQ), so a restart always registers a newer one."""
    return int(time.time() * 1000)


class PreparedObjectReaper:
    """Background component: expires PREPARED objects past their TTL and deletes marked objects'
    bytes after ``s3.object.delete.retention.minutes`` (so crashed uploads never leak)."""

    def __init__(
        self,
        metadata: MetadataStore,
        storage: ObjectStorage,
        *,
        namespace: str,
        retention_ms: int,
        period_s: float = REAPER_PERIOD_S,
        clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self.metadata = metadata
        self.storage = storage
        self.namespace = namespace
        self.retention_ms = retention_ms
        self.period_s = period_s
        self.clock_ms = clock_ms
        self.deleted_count = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="s3stream-prepared-reaper")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def run_once(self) -> list[ObjectId]:
        """One pass: expire, then delete what is past retention; returns the deleted ids."""
        now_ms = self.clock_ms()
        await self.metadata.expire_prepared(now_ms=now_ms)
        doomed = await self.metadata.destroyable_objects(
            marked_before_ms=now_ms - self.retention_ms + 1, limit=MAX_DELETE_BATCH
        )
        if not doomed:
            return []
        ids = [o.object_id for o in doomed]
        await self.storage.delete([object_key(i, self.namespace) for i in ids])
        await self.metadata.remove_objects(ids)
        self.deleted_count += len(ids)
        return ids

    async def _loop(self) -> None:
        while True:
            try:
                await self.run_once()
            except (S3StreamError, OSError) as exc:
                log.warning("object reaper pass failed (retried): %s", exc)
            await asyncio.sleep(self.period_s)


class BlockWalAdapter:
    """Adapts :class:`wal.BlockWAL` to the engine's :class:`~s3stream.engine.walport.WriteAheadLog`,
    translating the WAL's errors to s3stream's kinds (the WAL imports nothing of ours)."""

    def __init__(self, block_wal: BlockWAL, path: str) -> None:
        self._wal = block_wal
        self._path = path
        self.append_untranslated = block_wal.append
        """The block WAL's own append: the engine's hot path awaits it directly (one coroutine frame
        less per append) and translates its failures with :meth:`translate_error`."""

    def translate_error(self, exc: BaseException) -> BaseException:
        """The exception :meth:`append` raises instead of ``exc`` (a WAL or OS error's s3stream kind)."""
        if isinstance(exc, walerr.WalError | OSError):
            error = wal_error(exc, self._path)
            error.__cause__ = exc
            return error
        return exc

    async def append(self, body: BodyParts) -> int:
        # The hot path: a plain try costs less than the context manager the other calls use. Parts
        # go to the block WAL as they are: it writes them as one record with one body CRC.
        try:
            return await self._wal.append(body)
        except (walerr.WalError, OSError) as exc:
            raise wal_error(exc, self._path) from exc

    async def trim(self, offset: int) -> None:
        with translate_wal_errors(self._path):
            await self._wal.trim(offset)

    async def recover(self) -> list[tuple[int, bytes]]:
        with translate_wal_errors(self._path):
            return [(r.offset, r.data) for r in await self._wal.recover_all()]

    async def close(self) -> None:
        with translate_wal_errors(self._path):
            await self._wal.close()


@contextlib.contextmanager
def translate_wal_errors(path: str) -> Iterator[None]:
    """The one boundary where WAL errors become s3stream errors."""
    try:
        yield
    except (walerr.WalError, OSError) as exc:
        raise wal_error(exc, path) from exc


def wal_error(exc: walerr.WalError | OSError, path: str) -> S3StreamError:
    """The s3stream error kind of a WAL error."""
    if isinstance(exc, walerr.WalCapacityError):
        return CapacityError(f"WAL full: {exc}")
    if isinstance(exc, walerr.WalClosedError):
        return ClosedError(f"WAL closed: {exc}")
    if isinstance(exc, walerr.WalFencedError):
        return FencedError(f"WAL {path} fenced: {exc}")
    if isinstance(exc, walerr.WalLockedError):
        return ConflictError(f"data dir in use: WAL {path} is open in another process ({exc})")
    if isinstance(exc, walerr.WalArgumentError | walerr.InvalidWalConfig):
        return InvalidArgumentError(f"WAL {path}: {exc}")
    if isinstance(exc, walerr.WalCorruptionError):
        return CorruptionError(str(exc), source=path)
    return UnavailableError(f"WAL {path} failed: {exc}")


async def open_block_wal(path: Path, config: Config, *, node_epoch: int) -> BlockWalAdapter:
    """The block WAL file of the embedded default (preallocated by the WAL on creation)."""
    wal_config = WalConfig(
        capacity_bytes=config.wal_capacity_bytes,
        record_max_bytes=config.wal_record_max_bytes,
        node_id=config.node_id,
        node_epoch=node_epoch,
        io_threads=min(config.wal_thread_count, IO_THREADS_MAX),
        on_full="error",
        aio=config.wal_aio,
    )
    with translate_wal_errors(str(path)):
        block_wal = await BlockWAL.open(str(path), wal_config)
    return BlockWalAdapter(block_wal, str(path))


async def open_client(
    data_dir: str | os.PathLike[str],
    *,
    bucket_uri: str | None = None,
    config: Config | None = None,
    upload_observer: UploadObserver | None = None,
    wal: WriteAheadLog | None = None,
    metadata: MetadataStore | None = None,
    storage: ObjectStorage | None = None,
    node_epoch: int | None = None,
) -> Client:
    """Build and start every component; on failure close what was already started."""
    if not isinstance(data_dir, str | os.PathLike):
        raise InvalidArgumentError(f"data_dir must be a str or path, got {type(data_dir).__name__}")
    if not os.fspath(data_dir):
        raise InvalidArgumentError("data_dir is empty (give a directory; '.' for the current one)")
    if config is not None and not isinstance(config, Config):
        raise InvalidArgumentError(
            f"config must be an s3stream Config (Config.from_sources(...)), got {type(config).__name__}"
        )
    config = config or Config.from_sources()
    root = Path(data_dir)
    closers: list[Callable[[], Awaitable[None]]] = []
    try:
        await asyncio.to_thread(root.mkdir, parents=True, exist_ok=True)
    except (OSError, ValueError) as exc:  # ValueError: an embedded NUL
        raise InvalidArgumentError(f"cannot create data dir {str(root)!r}: {exc}") from exc
    try:
        epoch = node_epoch if node_epoch is not None else node_epoch_now()
        if wal is None:
            wal = await open_block_wal(root / "wal", config, node_epoch=epoch)
        closers.append(wal.close)
        storage_reachable = True
        if storage is None:
            storage = await _open_storage(root, bucket_uri)
            closers.append(storage.close)
            storage_reachable = await _check_access(storage)
        else:
            closers.append(storage.close)
        if metadata is None:
            from s3stream.metadata.sqlite import SqliteMetadataStore

            metadata = await SqliteMetadataStore.open(str(root / "metadata.db"))
        closers.append(metadata.close)
        if storage_reachable:
            await bind_storage(metadata, storage, namespace=config.namespace)
        reader = build_reader(config, metadata, storage)  # closed by the engine
        engine = Engine(
            config,
            wal=wal,
            metadata=metadata,
            storage=storage,
            node_id=NodeId(config.node_id),
            node_epoch=epoch,
            reader=reader,
            upload_observer=upload_observer,
        )
        await engine.start()
        reaper = PreparedObjectReaper(
            metadata,
            storage,
            namespace=config.namespace,
            retention_ms=config.object_delete_retention_minutes * 60_000,
        )
        reaper.start()
        closers.append(reaper.close)
        compactor = Compactor(config, metadata, storage, node_id=NodeId(config.node_id), node_epoch=epoch)
        compactor.start()
        closers.append(compactor.close)
    except BaseException:
        for closer in reversed(closers):
            with contextlib.suppress(Exception):
                await closer()
        raise
    client = Client(engine, metadata, closers=list(reversed(closers)))
    client.components.update(reaper=reaper, compactor=compactor, reader=reader)
    return client


def open_sync(
    data_dir: str | os.PathLike[str], *, bucket_uri: str | None = None, config: Config | None = None
) -> SyncClient:
    """Open a :class:`~s3stream.facade.SyncClient`: like ``await open_client(...)`` but blocking."""
    return SyncClient.start(lambda: open_client(data_dir, bucket_uri=bucket_uri, config=config))


STORAGE_BOUND_KEY = RESERVED_KV_PREFIX + "storage.bound"
"""Metadata KV key set once this metadata store has checked that its object storage holds no objects
of its namespace written by another one (:func:`bind_storage`)."""
BIND_SCAN_KEYS_MAX = 10_000
"""Keys :func:`bind_storage` looks at, at most (a bucket may hold other applications' keys too)."""


async def bind_storage(metadata: MetadataStore, storage: ObjectStorage, *, namespace: str) -> None:
    """Refuse object storage whose objects belong to another metadata store (ConflictError).

    Object ids come from the metadata store's counter and the object write is a plain PUT, so two
    data dirs on one bucket (and prefix and namespace) write the same keys: the second overwrote the
    first's objects, whose reads then returned the other's records as their own, and each one's
    orphan scan deletes the other's objects. A metadata store that has no stream and no object yet and
    is not bound refuses storage that already holds an object key of its namespace (a second data dir on
    the bucket, or this data dir's metadata lost: a fresh metadata store must not adopt, overwrite
    or garbage-collect those objects); then it records the binding, so later opens cost one read.
    Not caught: two fresh data dirs that both open before either uploads.
    """
    if await metadata.kv_get(STORAGE_BOUND_KEY) is not None:
        return
    if not await metadata.list_streams() and not await metadata.list_objects():
        try:
            found = await _first_object_key(storage, namespace)
        except UnavailableError as exc:
            log.warning(
                "could not list object storage to check it is this data dir's (checked later): %s", exc
            )
            return
        if found is not None:
            raise ConflictError(
                f"object storage {storage!r} already holds objects of namespace {namespace!r} (such as "
                f"{found!r}) that this new metadata store did not write: another data dir uses this bucket, "
                "or this data dir's metadata was lost. Give this data dir its own bucket prefix or "
                "s3.namespace (reusing the keys would overwrite those objects)"
            )
    await metadata.kv_put(STORAGE_BOUND_KEY, b"1", overwrite=False)


async def _first_object_key(storage: ObjectStorage, namespace: str) -> str | None:
    """An object key of ``namespace`` among the first BIND_SCAN_KEYS_MAX keys of the storage, or None."""
    scanned = 0
    async for info in storage.list(""):
        scanned += 1
        with contextlib.suppress(InvalidArgumentError):
            if parse_object_key(info.key)[1] == namespace:
                return info.key
        if scanned >= BIND_SCAN_KEYS_MAX:
            break
    return None


async def _check_access(storage: ObjectStorage) -> bool:
    """Whether storage answered: an S3 bucket that is missing or refuses the credentials fails the
    open; one that does not answer is only logged (appends go on while storage is down; they wait
    for room only once the WAL or the cache fills)."""
    from s3stream.storage.s3 import S3ObjectStorage

    if not isinstance(storage, S3ObjectStorage):
        return True
    unreachable = await storage.check_access()
    if unreachable is not None:
        log.warning("object storage did not answer at open (uploads will retry): %s", unreachable)
        return False
    return True


async def _open_storage(root: Path, bucket_uri: str | None) -> ObjectStorage:
    if bucket_uri is None:
        from s3stream.storage.local import LocalObjectStorage

        return LocalObjectStorage(str(root / "objects"))
    from s3stream.storage.s3 import S3ObjectStorage
    from s3stream.storage.uri import open_storage

    storage = open_storage(bucket_uri)
    if isinstance(storage, S3ObjectStorage):
        try:
            await storage.connect()  # start-up work at start-up, not at the first upload
        except BaseException:
            await storage.close()
            raise
    return storage


def freeze_startup_heap() -> int:
    """Collect garbage once, then move every object alive now out of the collector's way
    (:func:`gc.freeze`); returns how many objects are frozen.

    Call it once the application has started (engine open, streams opened). A full collection
    scans every tracked object that is not frozen; after start-up most of them (modules, botocore's
    S3 client and models, the engine's own structures) live as long as the process, so each full
    collection, and the event-loop stall it causes, is several times shorter. Objects created later
    are collected as usual; frozen objects that become unreachable are still freed by reference
    counting, only cycles among them stay until :func:`gc.unfreeze`. The collector stays enabled.
    See docs/architecture.md, "Latency and Python's garbage collector"."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
