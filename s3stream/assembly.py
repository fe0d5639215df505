"""The one module that wires the WAL, metadata, object storage, read path and engine together.

``open_client(data_dir, bucket_uri=None, config=None)`` builds the embedded default:
``<data_dir>/wal`` (the block WAL, preallocated), ``<data_dir>/objects`` (local object storage),
``<data_dir>/metadata.db`` (SQLite). A ``bucket_uri`` (``0@s3://bucket?endpoint=..``, ``file:///path``,
``mem://name``) puts objects there instead; the storage a data dir was created with is recorded in its
metadata and used when no ``bucket_uri`` is given (:mod:`s3stream.binding`). Object storage is checked
before anything is created, and a first open that fails removes what it created. ``s3.metadata.url``
names a shared metadata store instead of the data dir's SQLite file. The client is one node session
in that store (:func:`open_session`: a database-issued node epoch, a lease renewed by a
:class:`~s3stream.engine.heartbeat.Heartbeat` that fences the engine when it is lost). Components
start in dependency order and close in reverse; the :class:`~compaction.gc.PreparedObjectReaper` and
the :class:`~compaction.compactor.Compactor` are the jobs of the
:class:`~compaction.maintenance.MaintenanceElection`: they run only while this node holds the
maintenance lease, writing through the lease-bound store. ``open_sync`` is
the same behind the blocking facade. It is the top of the package: ``s3stream.open`` /
``s3stream.open_sync`` are these functions, and nothing in the engine, the facade, the storage or the
metadata layers imports this module (``tests/unit/test_engine_layering.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, cast

from compaction.compactor import Compactor
from compaction.gc import GarbageCollector, PreparedObjectReaper
from compaction.maintenance import MAINTENANCE_LEASE, MaintenanceElection
from s3stream import binding
from s3stream.buckets.monitor import BucketsMonitor
from s3stream.buckets.storage import MultiBucketStorage
from s3stream.clock import lease_clock_s
from s3stream.cluster.controller import CONTROLLER_LEASE, FailoverController
from s3stream.cluster.events import AssignmentHub
from s3stream.cluster.takeover import TakeoverObserver, Taker
from s3stream.cluster.watcher import ClusterWatcher, TakeoverRunner
from s3stream.config import Config
from s3stream.engine.blockcache import BlockCache
from s3stream.engine.client import Client
from s3stream.engine.core import Engine, UploadObserver
from s3stream.engine.heartbeat import Heartbeat
from s3stream.engine.reader import ObjectStreamReader
from s3stream.engine.walport import WriteAheadLog
from s3stream.errors import ErrorCode, InvalidArgumentError, UnavailableError
from s3stream.facade import SyncClient
from s3stream.ids import NodeId
from s3stream.metadata.base import MetadataStore, TakeoverState
from s3stream.metadata.store import TransactionalStore
from s3stream.metadata.url import open_metadata_store
from s3stream.metrics import start_metrics
from s3stream.objectformat import ObjectReaderCache
from s3stream.remote import Reader, SyncReader
from s3stream.storage.base import ObjectStorage
from s3stream.walblock import BlockWalAdapter, open_block_wal_file
from wal import WalConfig
from wal.config import IO_THREADS_MAX

if TYPE_CHECKING:
    from s3stream.metacopy.replicator import MetadataCopy
    from s3stream.metadata.sqlite import SqliteMetadataStore

READER_CACHE_BYTES = 16 * 1024 * 1024
"""Object index cache of the read path."""
WAL_FILE = "wal"
"""The block WAL of a data dir."""


def build_reader(config: Config, metadata: MetadataStore, storage: ObjectStorage) -> ObjectStreamReader:
    """The object read path (block cache + index cache + readahead) for the engine."""
    return ObjectStreamReader(
        metadata,
        storage,
        namespace=config.namespace,
        block_cache=BlockCache(config.block_cache_size_bytes),
        reader_cache=ObjectReaderCache(storage, capacity_bytes=READER_CACHE_BYTES),
    )


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
    return await open_block_wal_file(str(path), wal_config)


class _Created:
    """What this open created in the data dir, removed again if the open fails (never anything that
    existed before it: an existing data dir loses nothing)."""

    def __init__(self) -> None:
        self.files: list[Path] = []
        self.dirs: list[Path] = []
        """Removed only when empty, innermost first."""

    def remove(self) -> None:
        for path in self.files:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        for path in reversed(self.dirs):
            with contextlib.suppress(OSError):  # not empty or gone: left alone
                path.rmdir()


async def open_client(
    data_dir: str | os.PathLike[str],
    *,
    bucket_uri: str | None = None,
    config: Config | None = None,
    upload_observer: UploadObserver | None = None,
    takeover_observer: TakeoverObserver | None = None,
    wal: WriteAheadLog | None = None,
    metadata: MetadataStore | None = None,
    storage: ObjectStorage | None = None,
) -> Client:
    """Build and start every component; on failure close what was already started and remove what
    this open created.

    The metadata store is ``metadata`` if given, else the one ``s3.metadata.url`` names, else the
    data dir's SQLite file. The node's session comes from the store (``open_node``: the database
    issues the node epoch, which fences any older session of ``s3.node.id``), after the WAL is
    open, so a second process on a data dir in use is refused before it can fence the first."""
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
    node_id = NodeId(config.node_id)
    closers: list[Callable[[], Awaitable[None]]] = []
    created = _Created()
    try:
        storage_reachable, record_storage = True, storage is None
        opened_by_url = metadata is None and bool(config.metadata_url)
        if metadata is None and config.metadata_url:
            # every store open_metadata_store returns is a complete MetadataStore (close included)
            metadata = cast(MetadataStore, await open_metadata_store(config.metadata_url))
            closers.append(metadata.close)
        if storage is None:
            if metadata is None:
                recorded = await asyncio.to_thread(_recorded_storage, root)
            else:
                recorded = await binding.recorded_storage_of(metadata)
            if bucket_uri is None and config.data_buckets:
                bucket_uri = config.data_buckets  # s3.data.buckets: one bucket or a list
            bucket_uri = binding.storage_to_open(recorded, bucket_uri, namespace=config.namespace)
        created.dirs += await _make_data_dir(root)
        if storage is None:
            if bucket_uri is None:
                created.dirs += await asyncio.to_thread(_missing_dirs, root / binding.LOCAL_OBJECTS_DIR)
            storage = await binding.open_storage(root, bucket_uri, config)
            closers.append(storage.close)
            storage_reachable = await binding.check_access(storage)  # before the WAL is created
        else:
            closers.append(storage.close)
        copied_store, copy = None, None
        clustered = metadata is not None  # a shared (or given) store: this node follows the cluster
        if metadata is None:
            from s3stream.metadata.sqlite import SqliteMetadataStore

            metadata_path = root / binding.METADATA_FILE
            if not await asyncio.to_thread(metadata_path.exists):
                created.files[:0] = [Path(f"{metadata_path}{end}") for end in ("", "-wal", "-shm")]
            metadata = copied_store = await SqliteMetadataStore.open(str(metadata_path))
            closers.append(metadata.close)
        elif not opened_by_url:
            closers.append(metadata.close)
        wal_file = ""
        if wal is None:
            wal_path = root / WAL_FILE
            wal_file = str(wal_path.absolute())
            if clustered:
                await _wait_for_takeover(metadata, node_id, config)  # the taker reads this WAL meanwhile
            wal_existed = await asyncio.to_thread(wal_path.exists)
            # The WAL takes the data dir's lock before the session is opened. Its header's node epoch
            # only has to be at most the session's: the next epoch as stored now is.
            wal_epoch = await _next_node_epoch(metadata, node_id)
            wal = await open_block_wal(wal_path, config, node_epoch=wal_epoch)
            if not wal_existed:
                created.files.append(wal_path)
        closers.append(wal.close)
        heartbeat = await open_session(
            metadata,
            node_id=node_id,
            lease_ms=config.node_lease_ms,
            wal_path=wal_file,
            takeover_wait_ms=config.close_timeout_ms,
            retry_ms=config.cluster_poll_ms,
        )
        closers.append(heartbeat.close)
        epoch = heartbeat.node_epoch
        await binding.bind_storage(
            metadata,
            storage,
            namespace=config.namespace,
            bucket_uri=bucket_uri,
            recorded=record_storage,
            reachable=storage_reachable,
        )
        monitor = await _start_buckets(storage, metadata, config, bucket_uri=bucket_uri, node_id=node_id)
        if monitor is not None:
            closers.append(monitor.close)
        reader = build_reader(config, metadata, storage)  # closed by the engine
        engine = Engine(
            config,
            wal=wal,
            metadata=metadata,
            storage=storage,
            node_id=node_id,
            node_epoch=epoch,
            reader=reader,
            upload_observer=upload_observer,
            lease_check=heartbeat.holds_lease,
        )
        heartbeat.add_listener(engine.fence)
        heartbeat.wal_pending_bytes = lambda: engine.wal_pending_bytes
        # Metrics (s3stream.metrics): off unless s3.telemetry.metrics.exporter.uri; wired before the
        # engine starts (recovery uploads are metered) and before any stream is opened.
        metrics = start_metrics(config)
        closers.append(metrics.close)
        metrics.attach_engine(engine)
        metrics.attach_storage(storage)
        metrics.attach_heartbeat(heartbeat)
        await engine.start()
        engine_closer = len(closers)
        closers.append(engine.close)  # for a failure below; the client closes the engine itself
        hub = AssignmentHub()
        watcher, watcher_closer = None, -1
        if clustered:
            taker = takeover_runner(
                config, metadata, storage, node_id=node_id, node_epoch=epoch, observer=takeover_observer
            )
            watcher = ClusterWatcher(
                engine,
                metadata,
                hub,
                poll_ms=config.cluster_poll_ms,
                takeover_runner=taker,
                run_failures_max=config.wal_failover_run_failures_max,
            )
            heartbeat.add_listener(watcher.on_fenced)
            watcher.start()
            watcher_closer = len(closers)
            closers.append(watcher.close)  # for a failure below; the client closes it before the engine
        if copied_store is not None and _is_bucket(bucket_uri):
            copy = await _start_metadata_copy(copied_store, storage, config)
            closers.append(copy.close)  # closed after the engine, before the metadata store
        maintenance_store = _lease_bound(metadata, MAINTENANCE_LEASE)
        collector = GarbageCollector(
            maintenance_store,
            storage,
            namespace=config.namespace,
            retention_ms=config.object_delete_retention_minutes * 60_000,
            orphan_ttl_ms=0,  # the reaper scans no orphans (the compactor's collector does)
        )
        reaper = PreparedObjectReaper(collector)
        compactor = Compactor(
            config, maintenance_store, storage, node_id=node_id, node_epoch=epoch, cluster_wide=True
        )
        maintenance = MaintenanceElection(
            metadata,
            node_id=node_id,
            node_epoch=epoch,
            lease_ms=config.node_lease_ms,
            jobs=[reaper, compactor],
        )
        metrics.attach_compaction(compactor, [collector])
        heartbeat.add_listener(maintenance.on_fenced)
        await maintenance.start()
        closers.append(maintenance.close)
        controller, controller_election = None, None
        if clustered:  # failover: the node holding the "controller" lease fences dead nodes
            controller = FailoverController(
                _lease_bound(metadata, CONTROLLER_LEASE),
                node_id=node_id,
                poll_ms=config.cluster_poll_ms,
                stall_ms=config.wal_failover_progress_leases * config.node_lease_ms,
                attempts_max=config.wal_failover_attempts_max,
            )
            controller_election = MaintenanceElection(
                metadata,
                node_id=node_id,
                node_epoch=epoch,
                lease_ms=config.node_lease_ms,
                jobs=[controller],
                lease_name=CONTROLLER_LEASE,
            )
            heartbeat.add_listener(controller_election.on_fenced)
            await controller_election.start()
            closers.append(controller_election.close)
    except BaseException:
        for closer in reversed(closers):
            with contextlib.suppress(Exception):
                await closer()
        await asyncio.to_thread(created.remove)
        raise
    pre_closers = []
    if watcher is not None:
        del closers[watcher_closer]
        pre_closers.append(watcher.close)
    del closers[engine_closer]
    client = Client(engine, metadata, closers=list(reversed(closers)), hub=hub, pre_closers=pre_closers)
    client.metrics = metrics
    client.components.update(
        reaper=reaper, compactor=compactor, reader=reader, heartbeat=heartbeat, maintenance=maintenance
    )
    if watcher is not None:
        client.components["watcher"] = watcher
    if controller is not None:
        client.components.update(controller=controller, controller_election=controller_election, taker=taker)
    if copy is not None:
        client.components["metadata_copy"] = copy
    if monitor is not None:
        client.components["buckets_monitor"] = monitor
    return client


def takeover_runner(
    config: Config,
    metadata: MetadataStore,
    storage: ObjectStorage,
    *,
    node_id: NodeId,
    node_epoch: int,
    observer: TakeoverObserver | None = None,
) -> TakeoverRunner:
    """What this node runs when the controller assigns it a dead node's takeover: the WAL replay of
    :mod:`s3stream.cluster.takeover` as this node's session."""
    return Taker(
        metadata=metadata,
        storage=storage,
        config=config,
        node_id=node_id,
        node_epoch=node_epoch,
        attach_cmd=config.wal_failover_attach_cmd,
        observer=observer,
    )


async def _wait_for_takeover(metadata: MetadataStore, node_id: NodeId, config: Config) -> None:
    """Wait while a takeover of this node is PENDING or RUNNING (its taker reads this node's WAL, which
    must not be opened for writing meanwhile): at most ``s3.close.timeout.ms``, then UnavailableError
    (NODE_TAKEOVER_IN_PROGRESS, retriable)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + config.close_timeout_ms / 1000
    while True:
        takeovers = await metadata.list_takeovers()
        if not any(t.node_id == node_id and t.state is not TakeoverState.DONE for t in takeovers):
            return
        if loop.time() >= deadline:
            raise UnavailableError(
                f"node {node_id}: a takeover of this node is still in progress after s3.close.timeout.ms "
                f"({config.close_timeout_ms} ms); open again once it is done",
                code=ErrorCode.NODE_TAKEOVER_IN_PROGRESS,
            )
        await asyncio.sleep(config.cluster_poll_ms / 1000)


async def open_session(
    metadata: MetadataStore,
    *,
    node_id: NodeId,
    lease_ms: int,
    wal_path: str = "",
    takeover_wait_ms: int = 0,
    retry_ms: int = 100,
) -> Heartbeat:
    """Open the node's session (a new, database-issued node epoch), fence ``metadata``'s writes to it
    (``bind_node``, when the store supports it) and start its heartbeat. ``wal_path`` (absolute) is
    recorded for a taker. While a takeover of this node is in flight the open is refused
    (NODE_TAKEOVER_IN_PROGRESS): retried every ``retry_ms`` for up to ``takeover_wait_ms``, then raised."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + takeover_wait_ms / 1000
    while True:
        opened_at_s = lease_clock_s()
        try:
            info = await metadata.open_node(node_id=node_id, lease_ms=lease_ms, wal_path=wal_path)
            break
        except UnavailableError as exc:
            if exc.code is not ErrorCode.NODE_TAKEOVER_IN_PROGRESS or loop.time() >= deadline:
                raise
        await asyncio.sleep(retry_ms / 1000)
    if isinstance(metadata, TransactionalStore):
        metadata.bind_node(node_id, info.node_epoch)
    heartbeat = Heartbeat(
        metadata, node_id=node_id, node_epoch=info.node_epoch, lease_ms=lease_ms, opened_at_s=opened_at_s
    )
    heartbeat.start()
    return heartbeat


async def _next_node_epoch(metadata: MetadataStore, node_id: NodeId) -> int:
    """The epoch ``open_node`` would issue now (a later open issues at least this one)."""
    for info in await metadata.list_nodes():
        if info.node_id == node_id:
            return max(info.node_epoch + 1, 1)
    return 1


def _lease_bound(metadata: MetadataStore, lease_name: str) -> MetadataStore:
    """The view of ``metadata`` whose writes require this node to hold ``lease_name`` (the store itself
    when it has no such view: the maintenance election alone then keeps the jobs on one node)."""
    if isinstance(metadata, TransactionalStore) and metadata.bound_session is not None:
        return cast(MetadataStore, metadata.bind_lease(lease_name))  # a view: its close does nothing
    return metadata


def open_sync(
    data_dir: str | os.PathLike[str], *, bucket_uri: str | None = None, config: Config | None = None
) -> SyncClient:
    """Open a :class:`~s3stream.facade.SyncClient`: like ``await open_client(...)`` but blocking."""
    return SyncClient.start(lambda: open_client(data_dir, bucket_uri=bucket_uri, config=config))


async def open_reader(
    *, bucket_uri: str | None = None, metadata_url: str | None = None, config: Config | None = None
) -> Reader:
    """A :class:`~s3stream.remote.Reader` of the streams in ``metadata_url`` (default: the config's
    ``s3.metadata.url``) whose objects are in ``bucket_uri`` (default: the storage the metadata
    records, when that is a bucket). No data dir, no WAL; nothing written: the metadata is opened
    read-only (``open_metadata_store(..., read_only=True)``: SQLite without writing, PostgreSQL in a
    read-only session).

    InvalidArgumentError for bad arguments or no storage to read; ConflictError when the given
    storage or ``s3.namespace`` is not the one the metadata records."""
    from s3stream.metadata.url import open_metadata_store, parse_metadata_url

    if config is not None and not isinstance(config, Config):
        raise InvalidArgumentError(
            f"config must be an s3stream Config (Config.from_sources(...)), got {type(config).__name__}"
        )
    config = config or Config.from_sources()
    if bucket_uri is not None and (not isinstance(bucket_uri, str) or not bucket_uri):
        raise InvalidArgumentError(f"bucket_uri must be a non-empty str or None, got {bucket_uri!r}")
    if bucket_uri is None and config.data_buckets:
        bucket_uri = config.data_buckets  # s3.data.buckets, as for open_client
    if metadata_url is None:
        metadata_url = config.metadata_url
        if not metadata_url:
            raise InvalidArgumentError("a reader needs a metadata URL: metadata_url= or s3.metadata.url")
    parsed = parse_metadata_url(metadata_url)
    closers: list[Callable[[], Awaitable[None]]] = []
    try:
        metadata = cast(MetadataStore, await open_metadata_store(parsed, read_only=True))
        closers.append(metadata.close)
        recorded = await binding.recorded_storage_of(metadata)
        if recorded is not None and recorded.bucket_uri is None:  # a data dir's own objects/ folder
            recorded = binding.RecordedStorage(bucket_uri, recorded.namespace) if bucket_uri else None
            if recorded is None:
                raise InvalidArgumentError(
                    "the metadata's objects are in its data dir's objects/ folder: give "
                    "bucket_uri='file:///<data dir>/objects'"
                )
        uri = binding.storage_to_open(recorded, bucket_uri, namespace=config.namespace)
        if uri is None:
            raise InvalidArgumentError(
                f"the metadata {parsed.describe()} records no object storage: give bucket_uri="
            )
        storage = await binding.open_storage(Path(), uri, config)
        closers.append(storage.close)
        if isinstance(storage, MultiBucketStorage):  # reads follow the recorded placement
            storage.attach(metadata)
            storage.start(write_probes=False)  # a reader writes nothing
    except BaseException:
        for closer in reversed(closers):
            with contextlib.suppress(Exception):
                await closer()
        raise
    return Reader(metadata, build_reader(config, metadata, storage), closers=list(reversed(closers)))


def open_reader_sync(
    *, bucket_uri: str | None = None, metadata_url: str | None = None, config: Config | None = None
) -> SyncReader:
    """Open a :class:`~s3stream.remote.SyncReader`: like ``await open_reader(...)`` but blocking."""
    return SyncReader.start(
        lambda: open_reader(bucket_uri=bucket_uri, metadata_url=metadata_url, config=config)
    )


def _is_bucket(bucket_uri: str | None) -> bool:
    """Whether the objects are in an S3 bucket (a local ``objects/`` folder or ``file://`` path is lost
    with the disk that holds the metadata, so a copy there would not help)."""
    from s3stream.buckets.spec import is_bucket_list, parse_bucket_list
    from s3stream.storage.uri import parse_bucket_uri

    if bucket_uri is not None and is_bucket_list(bucket_uri):
        return parse_bucket_list(bucket_uri)[0].protocol == "s3"
    return bucket_uri is not None and parse_bucket_uri(bucket_uri).protocol == "s3"


async def _start_buckets(
    storage: ObjectStorage,
    metadata: MetadataStore,
    config: Config,
    *,
    bucket_uri: str | None,
    node_id: NodeId,
) -> BucketsMonitor | None:
    """Several buckets: attach the metadata that records object placement, record buckets the list
    adds, start the health probes and the monitor (live weights, published health). Before the engine
    starts, so recovery's uploads are placed. None for a single bucket (nothing to do)."""
    if not isinstance(storage, MultiBucketStorage):
        return None
    storage.attach(metadata)
    await binding.record_added_buckets(metadata, bucket_uri)
    storage.start()
    monitor = BucketsMonitor(storage, metadata, node_id=node_id, poll_ms=config.data_buckets_weights_poll_ms)
    await monitor.start()
    return monitor


async def _start_metadata_copy(
    store: SqliteMetadataStore, storage: ObjectStorage, config: Config
) -> MetadataCopy:
    """Keep a copy of the embedded metadata in the bucket (``s3stream.metacopy``). Started after the
    engine, so an open never waits for the bucket; from then on every metadata write does."""
    from s3stream.metacopy.replicator import MetadataCopy

    copy = MetadataCopy(
        store, storage, namespace=config.namespace, wait_timeout_ms=config.metadata_copy_wait_ms
    )
    await copy.start()
    return copy


def _recorded_storage(root: Path) -> binding.RecordedStorage | None:
    try:
        return binding.read_recorded_storage(root)
    except (OSError, ValueError) as exc:  # ValueError: an embedded NUL
        raise InvalidArgumentError(f"cannot read data dir {str(root)!r}: {exc}") from exc


def _missing_dirs(path: Path) -> list[Path]:
    """``path`` and its ancestors that do not exist yet, outermost first."""
    missing: list[Path] = []
    try:
        while not path.exists():
            missing.insert(0, path)
            if path.parent == path:
                break
            path = path.parent
    except (OSError, ValueError):
        return missing
    return missing


async def _make_data_dir(root: Path) -> list[Path]:
    """Create the data dir; returns the directories this created, outermost first."""
    missing = await asyncio.to_thread(_missing_dirs, root)
    try:
        await asyncio.to_thread(root.mkdir, parents=True, exist_ok=True)
    except (OSError, ValueError) as exc:  # ValueError: an embedded NUL
        raise InvalidArgumentError(f"cannot create data dir {str(root)!r}: {exc}") from exc
    return missing
