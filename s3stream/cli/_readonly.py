"""A read-only view of a data dir for the CLI's read commands (streams, objects, fetch).

Opening the client would write: it replays and uploads the WAL, bumps the epoch of every stream it
opens, adds ranges, runs compaction and GC, and it takes the WAL's lock, so it fails while another
process owns the data dir. This view writes nothing and takes no lock:

* metadata: ``metadata.db`` through the one read-only SQLite access
  (:mod:`s3stream.metadata.sqlite_readonly`): no file written or created, one consistent read
  transaction per query;
* objects: read from the object storage with the engine's object reader (ranged GETs only);
* WAL: the file opened ``O_RDONLY`` and scanned with the WAL's own recovery scanner; its bodies are
  decoded with the engine's WAL body codec. The records of a stream from its committed end offset on
  (appended, not yet uploaded) come from there. The WAL of a live process may be mid-write: the
  first record that fails its checks is the end (what is shown is what was durable when read), and
  a scan that stops early is reported as a note rather than as an error.

Nothing here changes a byte of the data dir; ``tests/integration/test_cli_readonly.py`` hashes
``metadata.db`` and ``wal`` around the read commands.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from s3stream.binding import LOCAL_OBJECTS_DIR, METADATA_FILE, recorded_storage_of, storage_to_open
from s3stream.config import Config
from s3stream.engine.blockcache import BlockCache
from s3stream.engine.reader import ObjectStreamReader
from s3stream.engine.walbody import decode_body
from s3stream.errors import (
    CorruptionError,
    NotFoundError,
)
from s3stream.ids import StreamId
from s3stream.metadata.base import MetadataStore
from s3stream.metadata.sqlite_readonly import ReadOnlySqliteStore
from s3stream.objectformat import ObjectReaderCache
from s3stream.record import StreamRecordBatch
from s3stream.storage.base import ObjectStorage
from wal.errors import WalCorruptionError
from wal.readonly import HEADER_PROBE_BYTES, ReadOnlyFile, newest_header
from wal.recovery import Layout, Scanner

READER_CACHE_BYTES = 4 * 1024 * 1024
"""Object index cache of the view's object reader."""
BLOCK_CACHE_BYTES = 16 * 1024 * 1024
"""Data block cache of the view's object reader."""


@dataclass
class WalView:
    """The record batches the WAL holds (from its trim offset on), by stream, in WAL order."""

    batches: dict[int, list[StreamRecordBatch]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def scan_wal(path: str) -> WalView:
    """Every batch of the WAL at ``path`` (blocking: run it in a thread). Writes nothing."""
    view = WalView()
    try:
        device = ReadOnlyFile(path)
    except FileNotFoundError:
        view.notes.append(f"no WAL at {path}: records not yet uploaded cannot be shown")
        return view
    except OSError as exc:
        view.notes.append(
            f"cannot read the WAL {path} ({exc.strerror}): records not yet uploaded are not shown"
        )
        return view
    try:
        head = bytearray(HEADER_PROBE_BYTES)
        got = device.read_into(0, memoryview(head))
        header = newest_header(bytes(head[:got]))
        if header is None:
            view.notes.append(f"the WAL {path} has no valid header: records not yet uploaded are not shown")
            return view
        scanner = Scanner(device, Layout(header.block_size, header.capacity), header)
        try:
            while not scanner.done:
                for rec in scanner.next_batch():
                    body = decode_body(rec.data, source=path, position=rec.offset)
                    for batch in body.batches:
                        view.batches.setdefault(batch.stream_id, []).append(batch)
        except (WalCorruptionError, CorruptionError) as exc:
            # A live owner may be writing where the scan reads: what was read before is shown.
            view.notes.append(
                f"WAL scan stopped early ({exc}): later records not yet uploaded may be missing"
            )
        finally:
            scanner.reader.close()
    finally:
        device.close()
    return view


def open_storage_readonly(data_dir: Path, bucket_uri: str | None) -> ObjectStorage | None:
    """The object storage at ``bucket_uri`` (the data dir's recorded or given one, see
    :func:`s3stream.binding.storage_to_open`), else the local ``<data_dir>/objects`` (None when that
    does not exist: the data dir has uploaded nothing). Creates nothing.

    The one place the read commands choose their storage."""
    if bucket_uri is not None:
        from s3stream.buckets.spec import is_bucket_list
        from s3stream.storage.uri import open_storage

        if is_bucket_list(bucket_uri):  # several buckets: reads follow the placement in the metadata
            from s3stream.buckets.build import build_multi_bucket_storage

            return build_multi_bucket_storage(bucket_uri, Config())
        return open_storage(bucket_uri)
    objects = data_dir / LOCAL_OBJECTS_DIR
    if not objects.is_dir():
        return None
    from s3stream.storage.local import LocalObjectStorage

    return LocalObjectStorage(str(objects))


class ReadOnlyView:
    """Metadata, objects and WAL of a data dir, read without writing. Use :meth:`open`, then ``close()``."""

    def __init__(
        self, data_dir: Path, config: Config, metadata: MetadataStore, storage: ObjectStorage | None
    ) -> None:
        self.data_dir = data_dir
        self.config = config
        self.metadata: MetadataStore = metadata
        self._metadata = metadata
        self._storage = storage
        self._reader: ObjectStreamReader | None = None
        self._wal: WalView | None = None
        if storage is not None:
            self._reader = ObjectStreamReader(
                metadata,
                storage,
                namespace=config.namespace,
                block_cache=BlockCache(BLOCK_CACHE_BYTES),
                reader_cache=ObjectReaderCache(storage, capacity_bytes=READER_CACHE_BYTES),
            )

    @classmethod
    async def open(
        cls, data_dir: str, *, bucket_uri: str | None, config: Config, metadata: MetadataStore | None = None
    ) -> ReadOnlyView:
        """The view of ``data_dir``. ``metadata``: a store the caller opened read-only, used instead of
        the data dir's ``metadata.db`` (the data dir may then be missing); the view owns it from this
        call on, and closes it when the open fails."""
        root = Path(data_dir)
        if metadata is None:
            if not await asyncio.to_thread(root.is_dir):
                raise NotFoundError(f"no data dir at {data_dir} (--data-dir, or $S3STREAM_DATA_DIR)")
            metadata = await ReadOnlySqliteStore.open(str(root / METADATA_FILE))
        try:
            recorded = await recorded_storage_of(metadata)
            bucket_uri = storage_to_open(recorded, bucket_uri, namespace=config.namespace)
            storage = await asyncio.to_thread(open_storage_readonly, root, bucket_uri)
            attach = getattr(storage, "attach", None)  # MultiBucketStorage: placement from this metadata
            if attach is not None:
                attach(metadata)
        except BaseException:
            await metadata.close()
            raise
        return cls(root, config, metadata, storage)

    @property
    def notes(self) -> list[str]:
        """What the view could not show (empty until the WAL was scanned)."""
        return self._wal.notes if self._wal is not None else []

    async def wal(self) -> WalView:
        """The WAL's batches, scanned once."""
        if self._wal is None:
            self._wal = await asyncio.to_thread(scan_wal, str(self.data_dir / "wal"))
        return self._wal

    async def unuploaded(self, stream_id: StreamId, committed_end: int) -> list[StreamRecordBatch]:
        """The WAL's batches of ``stream_id`` that continue its objects from ``committed_end``:
        contiguous, the newest write of an offset winning (a reopened stream rewrites what its
        previous owner left unacknowledged)."""
        by_base: dict[int, StreamRecordBatch] = {}
        for batch in (await self.wal()).batches.get(stream_id, []):
            if batch.base_offset >= committed_end:
                by_base[batch.base_offset] = batch
        out = []
        offset = committed_end
        while offset in by_base:
            batch = by_base[offset]
            out.append(batch)
            offset = batch.base_offset + batch.count
        return out

    async def read_objects(
        self, stream_id: StreamId, start_offset: int, end_offset: int, max_bytes: int
    ) -> list[StreamRecordBatch]:
        if self._reader is None:
            return []
        return await self._reader.read(stream_id, start_offset, end_offset, max_bytes)

    async def close(self) -> None:
        if self._reader is not None:
            with contextlib.suppress(Exception):
                await self._reader.close()
        if self._storage is not None:
            with contextlib.suppress(Exception):
                await self._storage.close()
        await self._metadata.close()


async def open_view(data_dir: str, *, bucket_uri: str | None, config_path: str | None) -> ReadOnlyView:
    """The read-only view of ``--data-dir`` (config from ``--config`` and the environment, checked
    first); NotFoundError for a missing data dir."""
    config = Config.from_sources(config_path)
    return await ReadOnlyView.open(data_dir, bucket_uri=bucket_uri, config=config)


async def readable_end(view: ReadOnlyView, stream_id: StreamId, uploaded_end: int) -> int:
    """Where a stream's records end: its objects' end, continued by its WAL records not yet uploaded."""
    pending = await view.unuploaded(stream_id, uploaded_end)
    return pending[-1].base_offset + pending[-1].count if pending else uploaded_end


def print_notes(view: ReadOnlyView, out: TextIO | None = None) -> None:
    """What the view could not show, one ``note:`` line each on stderr (stdout stays parseable)."""
    for note in view.notes:
        print(f"note: {note}", file=out or sys.stderr)
