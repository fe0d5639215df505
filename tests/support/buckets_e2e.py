"""The end-to-end scenario of one placement strategy over two buckets, through the client: appends,
uploads, reads, compaction (StreamSet and stream objects), GC and the orphan scan; then what each
bucket holds is checked against the metadata. Shared by the in-memory unit test and the Ceph RGW
integration test (each names its buckets and hands in a plain storage per bucket to inspect)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from compaction.compactor import Compactor
from compaction.gc import GarbageCollector
from s3stream import RecordBatch
from s3stream.assembly import open_client
from s3stream.buckets.storage import MultiBucketStorage
from s3stream.config import Config
from s3stream.engine.client import Client, Stream
from s3stream.metadata.base import ObjectState
from s3stream.objectformat import object_key, parse_object_key
from s3stream.storage.base import ObjectStorage

KiB = 1024
MiB = 1024 * KiB

CONFIG = Config(
    wal_capacity_bytes=64 * MiB,
    wal_record_max_bytes=2 * MiB,
    record_max_bytes=1 * MiB,
    wal_cache_size_bytes=32 * MiB,
    wal_upload_threshold_bytes=16 * MiB,
    wal_upload_interval_ms=3_600_000,
    object_prepared_ttl_ms=60_000,
    object_delete_retention_minutes=0,
    upload_retry_backoff_ms=20,
    stream_set_object_compaction_stream_split_size_bytes=32 * KiB,
    namespace="mb",
)


def payload(stream_id: int, base: int, size: int) -> bytes:
    head = f"{stream_id}:{base}:".encode()
    return (head * (size // len(head) + 1))[:size]


async def read_all(stream: Stream) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    offset = stream.start_offset
    while offset < stream.confirm_offset:
        got = await stream.fetch(offset, stream.confirm_offset, max_bytes=8 * MiB)
        out += [(b.base_offset, b.payload) for b in got]
        offset = got[-1].end_offset
    return out


async def object_keys(storage: ObjectStorage, namespace: str) -> set[str]:
    keys = set()
    async for info in storage.list(""):
        try:
            if parse_object_key(info.key)[1] == namespace:
                keys.add(info.key)
        except Exception:
            continue
    return keys


async def ingest(client: Client, streams: Sequence[Stream], rounds: int) -> None:
    for _ in range(rounds):
        for stream in streams:
            for _ in range(5):
                base = stream.next_offset
                await stream.append(RecordBatch(payload(stream.stream_id, base, 4 * KiB + base % 97)))
        await client.engine.force_upload(None)


async def bucket_contents(client: Client, buckets: dict[int, ObjectStorage]) -> dict[int, set[str]]:
    return {b: await object_keys(s, client.config.namespace) for b, s in buckets.items()}


async def check_buckets_match_metadata(
    client: Client, buckets: dict[int, ObjectStorage]
) -> dict[int, set[str]]:
    """Every committed object is in each bucket its placement names; no bucket holds another object key."""
    namespace = client.config.namespace
    metadata = client.engine.metadata
    committed = await metadata.list_objects([ObjectState.COMMITTED])
    placements = await metadata.placements([o.object_id for o in committed])
    contents = await bucket_contents(client, buckets)
    first = next(iter(buckets))
    expected: dict[int, set[str]] = {b: set() for b in buckets}
    for obj in committed:
        for bucket_id in placements.get(obj.object_id, (first,)):
            expected[bucket_id].add(object_key(obj.object_id, namespace))
    for bucket_id, keys in contents.items():
        assert expected[bucket_id] <= keys, f"bucket {bucket_id} misses objects placed in it"
        assert keys <= {object_key(o.object_id, namespace) for o in committed}, f"bucket {bucket_id}: orphans"
    return contents


async def run_scenario(
    tmp_path: Path, bucket_list: str, strategy: str, buckets: dict[int, ObjectStorage], **config: object
) -> dict[str, dict[int, set[str]]]:
    """Returns what each bucket held after ingest (``"ingest"``) and at the end (``"end"``)."""
    conf = CONFIG.replace(data_buckets_strategy=strategy, **config)
    client = await open_client(tmp_path / "node", bucket_uri=bucket_list, config=conf)
    try:
        assert isinstance(client.engine.storage, MultiBucketStorage)
        streams = [await client.streams.create_and_open_stream() for _ in range(3)]
        await ingest(client, streams, 4)
        after_ingest = await check_buckets_match_metadata(client, buckets)
        before = [await read_all(s) for s in streams]
        assert sum(len(r) for r in before) == 3 * 4 * 5
        e = client.engine
        compactor = Compactor(conf, e.metadata, e.storage, node_id=e.node_id, node_epoch=e.node_epoch)
        report = await compactor.run_once(stream_objects=True)
        assert report.problems == ()
        assert report.stream_set_objects_compacted >= 4
        assert [await read_all(s) for s in streams] == before
        # an orphan in every bucket: an object id metadata no longer knows, below the next id (its bytes
        # are written after the id is forgotten, so the node's own reaper never sees it)
        orphan_id = await e.metadata.prepare_objects(count=1, ttl_ms=3_600_000)
        orphan = object_key(orphan_id, conf.namespace)
        await e.metadata.mark_destroyed([orphan_id], now_ms=e.metadata.now_ms())  # type: ignore[attr-defined]
        await e.metadata.remove_objects([orphan_id])
        for storage in buckets.values():
            await storage.put(orphan, b"orphan")
        far = e.metadata.now_ms() + 10**9  # type: ignore[attr-defined]
        collector = GarbageCollector(
            e.metadata,
            e.storage,
            namespace=conf.namespace,
            retention_ms=0,
            orphan_ttl_ms=1,
            clock_ms=lambda: far,
        )
        gc_report = await collector.collect(scan_orphans=True)
        assert gc_report.orphan_deleted_count == 1
        end = await check_buckets_match_metadata(client, buckets)
        assert all(orphan not in keys for keys in end.values())
        assert [await read_all(s) for s in streams] == before
    finally:
        await client.close()
    return {"ingest": after_ingest, "end": end}
