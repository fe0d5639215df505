"""Which object storage a data dir's objects live in: opened, checked, and recorded in its metadata.

A data dir's metadata names the objects it owns; those objects are only found in the storage they were
written to. So the first open of a data dir records that storage in the metadata (reserved KV key
:data:`STORAGE_BOUND_KEY`): the bucket URI without credentials (``accessKey``/``secretKey`` are never
stored) or the data dir's own ``objects/`` folder, and the namespace. Later opens that give no bucket
URI use the recorded one (credentials then come from the environment, as for any URI without keys);
one that names another storage (bucket, endpoint, prefix or local path) or another namespace is
refused with a :class:`~s3stream.errors.ConflictError` naming both. Tuning keys of a URI (part sizes,
timeouts, ...) may differ between opens. There is no migration between storages.

Data dirs created before the storage was recorded hold the value ``b"1"`` under the key: they keep
opening as before (with whatever storage the open names) and nothing is recorded for them.

:func:`read_recorded_storage` reads the record of a data dir without writing anything.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode

from s3stream.buckets.record import check_against_record, list_without_secrets
from s3stream.buckets.spec import is_bucket_list
from s3stream.config import Config
from s3stream.engine.client import RESERVED_KV_PREFIX
from s3stream.errors import ConflictError, CorruptionError, InvalidArgumentError, UnavailableError
from s3stream.logfmt import log_event
from s3stream.metadata.base import MetadataStore
from s3stream.metadata.sqlite_readonly import read_kv_value
from s3stream.objectformat import parse_object_key
from s3stream.storage.base import ObjectStorage
from s3stream.storage.uri import BucketURI, parse_bucket_uri

log = logging.getLogger(__name__)

METADATA_FILE = "metadata.db"
"""The SQLite metadata store of a data dir."""
LOCAL_OBJECTS_DIR = "objects"
"""The object storage of a data dir opened without a bucket URI."""
STORAGE_BOUND_KEY = RESERVED_KV_PREFIX + "storage.bound"
"""Metadata KV key holding the storage record of the data dir (JSON, see :class:`RecordedStorage`);
``b"1"`` in data dirs created before the record existed (bound, storage not recorded)."""
RECORD_VERSION = 1
BIND_SCAN_KEYS_MAX = 10_000
"""Keys :func:`bind_storage` looks at, at most (a bucket may hold other applications' keys too)."""
_SECRET_KEYS = frozenset({"accessKey", "secretKey"})


@dataclass(frozen=True, slots=True)
class RecordedStorage:
    """The object storage recorded in a data dir's metadata."""

    bucket_uri: str | None
    """The bucket URI without credentials; None: the data dir's own ``objects/`` folder (the record
    says ``"storage": "local objects/ folder"``)."""
    namespace: str
    """The ``s3.namespace`` its object keys carry."""
    checked: bool = True
    """Whether the storage was checked to hold no other data dir's objects (it may not have answered
    at the first open; the check then runs at a later open, while the metadata is still empty)."""

    def describe(self) -> str:
        where = (
            self.bucket_uri if self.bucket_uri is not None else f"the data dir's {LOCAL_OBJECTS_DIR}/ folder"
        )
        return f"{where} (namespace {self.namespace!r})"

    def encode(self) -> bytes:
        fields = {
            "version": RECORD_VERSION,
            "storage": "local objects/ folder" if self.bucket_uri is None else "bucket",
            "bucket_uri": self.bucket_uri,
            "namespace": self.namespace,
            "checked": self.checked,
        }
        return json.dumps(fields, sort_keys=True).encode()

    @staticmethod
    def decode(value: bytes) -> RecordedStorage | None:
        """The record in a KV value; None for the value of data dirs older than the record."""
        if value == b"1":
            return None
        try:
            fields = json.loads(value)
            if fields["version"] != RECORD_VERSION:
                raise ValueError(f"version {fields['version']!r}")
            bucket_uri, namespace, checked = fields["bucket_uri"], fields["namespace"], fields["checked"]
            if not (bucket_uri is None or isinstance(bucket_uri, str)) or not isinstance(namespace, str):
                raise ValueError("bad field types")
            return RecordedStorage(bucket_uri, namespace, bool(checked))
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptionError(
                f"the storage record of the metadata is not readable: {exc}", source=STORAGE_BOUND_KEY
            ) from exc


def read_recorded_storage(data_dir: str | os.PathLike[str]) -> RecordedStorage | None:
    """The object storage recorded in the metadata of ``data_dir``, read without writing anything.

    None when the data dir has no metadata yet, or was created before the storage was recorded (it
    then opens with whatever storage is given). Blocking (a small SQLite read; use
    ``asyncio.to_thread`` from async code); works while another process has the data dir open.
    Raises CorruptionError for a damaged record or database.
    """
    value = read_kv_value(Path(data_dir) / METADATA_FILE, STORAGE_BOUND_KEY)
    return None if value is None else RecordedStorage.decode(value)


async def recorded_storage_of(metadata: MetadataStore) -> RecordedStorage | None:
    """:func:`read_recorded_storage` for an open metadata store."""
    value = await metadata.kv_get(STORAGE_BOUND_KEY)
    return None if value is None else RecordedStorage.decode(value)


def without_secrets(bucket_uri: str) -> str:
    """``bucket_uri`` as it is recorded: the same storage and client settings, no credentials (a bucket
    list: each entry so, with its id)."""
    if is_bucket_list(bucket_uri):
        return list_without_secrets(bucket_uri, without_secrets)
    parsed = parse_bucket_uri(bucket_uri)
    id_part = f"{parsed.bucket_id}@" if parsed.bucket_id else ""
    if parsed.protocol == "file":
        return f"{id_part}file://{parsed.bucket}"
    if parsed.protocol == "mem":
        return f"{id_part}mem://{parsed.bucket}"
    params = {k: v for k, v in parsed.params.items() if k not in _SECRET_KEYS}
    query = f"?{urlencode(params)}" if params else ""
    return f"{id_part}s3://{parsed.bucket}{query}"


def _identity(parsed: BucketURI) -> tuple[str, ...]:
    """What names the objects of a storage: for ``s3://`` the bucket, endpoint and prefix (the other
    query keys tune the client or carry credentials)."""
    if parsed.protocol == "file":
        return ("file", os.path.normpath(parsed.bucket))
    if parsed.protocol == "mem":
        return ("mem", parsed.bucket)
    endpoint = (parsed.params.get("endpoint") or "").rstrip("/")
    prefix = parsed.params.get("prefix", "")
    return ("s3", parsed.bucket, endpoint, prefix if not prefix or prefix.endswith("/") else prefix + "/")


def storage_to_open(
    recorded: RecordedStorage | None, bucket_uri: str | None, *, namespace: str
) -> str | None:
    """The bucket URI an open uses (None: the data dir's ``objects/`` folder): the given one, else the
    recorded one. ConflictError when the given storage or namespace is not the recorded one."""
    if recorded is None:
        return bucket_uri
    given_where = (
        "the data dir's objects/ folder (no bucket URI)"
        if bucket_uri is None
        else repr(without_secrets(bucket_uri))
    )
    if recorded.namespace != namespace:
        raise ConflictError(
            f"this data dir's objects carry namespace {recorded.namespace!r}, not {namespace!r} (s3.namespace): "
            f"its storage is {recorded.describe()}"
        )
    if bucket_uri is None:
        return recorded.bucket_uri
    if recorded.bucket_uri is not None and (
        is_bucket_list(bucket_uri) or is_bucket_list(recorded.bucket_uri)
    ):
        check_against_record(recorded.bucket_uri, bucket_uri, _identity)  # several buckets
        return bucket_uri
    if recorded.bucket_uri is None or _identity(parse_bucket_uri(bucket_uri)) != _identity(
        parse_bucket_uri(recorded.bucket_uri)
    ):
        raise ConflictError(
            f"this data dir's objects are in {recorded.describe()}, not in {given_where}: open it with "
            "its own storage (or no bucket URI); moving a data dir to other storage is not supported"
        )
    return bucket_uri


async def bind_storage(
    metadata: MetadataStore,
    storage: ObjectStorage,
    *,
    namespace: str,
    bucket_uri: str | None,
    recorded: bool,
    reachable: bool = True,
) -> None:
    """Record the storage of a new data dir, refusing storage whose objects are another's (ConflictError).

    The storage is recorded only for a new data dir (no stream, no object) whose storage the assembly
    opened from ``bucket_uri`` (``recorded``); storage handed in by the caller, or a data dir from
    before the record, is bound without recording it (``b"1"``), as before. A first open whose storage
    did not answer records it unchecked; a later open checks it.

    Object ids come from the metadata store's counter and the object write is a plain PUT, so two
    data dirs on one bucket (and prefix and namespace) write the same keys: the second overwrote the
    first's objects, whose reads then returned the other's records as their own, and each one's
    orphan scan deletes the other's objects. A metadata store that has no stream and no object yet and
    is not bound refuses storage that already holds an object key of its namespace (a second data dir on
    the bucket, or this data dir's metadata lost: a fresh metadata store must not adopt, overwrite
    or garbage-collect those objects); then it records the binding, so later opens cost one read.
    Not caught: two fresh data dirs that both open before either uploads.
    """
    value = await metadata.kv_get(STORAGE_BOUND_KEY)
    record = None if value is None else RecordedStorage.decode(value)
    if value is not None and (record is None or record.checked):
        return
    empty = not await metadata.list_streams() and not await metadata.list_objects()
    checked = reachable
    if reachable and empty:
        try:
            found = await _first_object_key(storage, namespace)
        except UnavailableError as exc:
            log_event(log, logging.WARNING, "storage.bind_check_deferred", error=exc, action="checked later")
            checked = False
        else:
            if found is not None:
                raise ConflictError(
                    f"object storage {storage!r} already holds objects of namespace {namespace!r} (such "
                    f"as {found!r}) that this new metadata store did not write: another data dir uses "
                    "this bucket, or this data dir's metadata was lost. Give this data dir its own bucket "
                    "prefix or s3.namespace (reusing the keys would overwrite those objects)"
                )
    if record is None and (not recorded or not empty):
        # storage handed in by the caller, or a data dir from before the record whose objects may be
        # elsewhere: bound as before, the storage not recorded
        if checked:
            await metadata.kv_put(STORAGE_BOUND_KEY, b"1", overwrite=False)
        return
    if record is not None:
        if checked:
            await metadata.kv_put(STORAGE_BOUND_KEY, dataclasses.replace(record, checked=True).encode())
        return
    uri = None if bucket_uri is None else without_secrets(bucket_uri)
    new = RecordedStorage(uri, namespace, checked)
    await metadata.kv_put(STORAGE_BOUND_KEY, new.encode(), overwrite=False)


async def record_added_buckets(metadata: MetadataStore, bucket_uri: str | None) -> None:
    """Append to the storage record the buckets a bucket list adds (checked by :func:`storage_to_open`)."""
    record = await recorded_storage_of(metadata)
    if record is None or record.bucket_uri is None or bucket_uri is None or not is_bucket_list(bucket_uri):
        return
    grown = check_against_record(record.bucket_uri, bucket_uri, _identity)
    if grown is not None:
        updated = dataclasses.replace(record, bucket_uri=without_secrets(grown))
        await metadata.kv_put(STORAGE_BOUND_KEY, updated.encode())


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


async def open_storage(root: Path, bucket_uri: str | None, config: Config | None = None) -> ObjectStorage:
    """The object storage of data dir ``root``: ``bucket_uri``'s, else its ``objects/`` folder. An S3
    client is created now (start-up work at start-up, not at the first upload); no request is sent.
    A bucket list (``0@s3://a,1@s3://b``) gives a :class:`~s3stream.buckets.storage.MultiBucketStorage`
    with ``config``'s strategy and health settings; its metadata store is attached by the caller."""
    if bucket_uri is not None and is_bucket_list(bucket_uri):
        from s3stream.buckets.build import build_multi_bucket_storage

        multi = build_multi_bucket_storage(bucket_uri, config or Config())
        try:
            await multi.connect()
        except BaseException:
            await multi.close()
            raise
        return multi
    if bucket_uri is None:
        from s3stream.storage.local import LocalObjectStorage

        return LocalObjectStorage(str(root / LOCAL_OBJECTS_DIR))
    from s3stream.storage.s3 import S3ObjectStorage
    from s3stream.storage.uri import open_storage as open_uri

    storage = open_uri(bucket_uri)
    if isinstance(storage, S3ObjectStorage):
        try:
            await storage.connect()
        except BaseException:
            await storage.close()
            raise
    return storage


async def check_access(storage: ObjectStorage) -> bool:
    """Whether storage answered: an S3 bucket that is missing or refuses the credentials fails the
    open (NotFoundError, InvalidArgumentError); one that does not answer is only logged (appends go
    on while storage is down; they wait for room only once the WAL or the cache fills)."""
    check = getattr(storage, "check_access", None)  # S3ObjectStorage's (the others need none)
    if check is None:
        return True
    unreachable = await check()
    if unreachable is not None:
        log_event(
            log, logging.WARNING, "storage.unreachable_at_open", error=unreachable, action="uploads retry"
        )
        return False
    return True
