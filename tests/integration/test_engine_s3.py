"""The engine on a real S3 server (Ceph RGW through the s3_server fixture), each test on a fresh prefix."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from compaction.gc import GarbageCollector, PreparedObjectReaper
from s3stream import RecordBatch
from s3stream.assembly import open_client
from s3stream.config import Config
from s3stream.ids import NodeId
from s3stream.metadata.base import ObjectState
from s3stream.objectformat import object_key
from tests.support.s3 import S3TestServer

pytestmark = pytest.mark.integration
KiB = 1024

CONFIG = Config(
    wal_capacity_bytes=32 << 20,
    wal_record_max_bytes=2 << 20,
    record_max_bytes=1 << 20,
    wal_cache_size_bytes=16 << 20,
    wal_upload_threshold_bytes=1 << 20,
    stream_object_split_size_bytes=256 * KiB,
    object_prepared_ttl_ms=1000,
    object_delete_retention_minutes=0,
    upload_retry_backoff_ms=20,
)


def data(stream_id: int, base: int, size: int) -> bytes:
    return (f"{stream_id}:{base}:".encode() * (size // 8 + 1))[:size]


async def test_engine_round_trip_on_s3_with_stream_set_and_stream_objects(
    tmp_path: Path, s3_server: S3TestServer, s3_prefix: str
) -> None:
    uri = s3_server.uri(s3_prefix)
    client = await open_client(tmp_path, bucket_uri=uri, config=CONFIG)
    streams = [await client.streams.create_and_open_stream() for _ in range(5)]
    sizes = {s.stream_id: (64 * KiB if i == 0 else 2 * KiB) for i, s in enumerate(streams)}
    for _ in range(12):
        for s in streams:
            base = s.next_offset
            assert await s.append(RecordBatch(data(s.stream_id, base, sizes[s.stream_id]))) == base
    ids = [s.stream_id for s in streams]
    await client.close()
    assert client.engine.stats.uploads >= 1

    again = await open_client(tmp_path, bucket_uri=uri, config=CONFIG)
    ssos = await again.engine.metadata.get_stream_set_objects(NodeId(0))
    assert ssos, "small streams share a StreamSet object"
    big = await again.engine.metadata.get_stream_objects(
        stream_id=ids[0], start_offset=0, end_offset=12, limit=10
    )
    assert big, "the large stream got its own stream object"
    for sid in ids:
        s = await again.streams.open_stream(sid, epoch=1)
        got = await s.fetch(0, 12, max_bytes=1 << 30)
        assert [(b.base_offset, b.payload) for b in got] == [(i, data(sid, i, sizes[sid])) for i in range(12)]
    await again.close()


async def test_crash_recovery_uploads_the_wal_to_s3(
    tmp_path: Path, s3_server: S3TestServer, s3_prefix: str
) -> None:
    uri = s3_server.uri(s3_prefix)
    config = CONFIG.replace(wal_upload_interval_ms=3_600_000, wal_upload_threshold_bytes=8 << 20)
    client = await open_client(tmp_path, bucket_uri=uri, config=config)
    stream = await client.streams.create_and_open_stream(epoch=2)
    for i in range(50):
        await stream.append(RecordBatch(data(stream.stream_id, i, 500)))
    client.engine.abandon()  # crash: nothing uploaded
    await client.engine.wal.close()
    await client.engine.metadata.close()
    await client.engine.storage.close()
    assert client.engine.stats.uploads == 0

    again = await open_client(tmp_path, bucket_uri=uri, config=config)
    assert again.engine.stats.recovered_records == 50
    s = await again.streams.open_stream(stream.stream_id, epoch=2)
    again.engine.cache.try_real_free(target_bytes=0)
    got = await s.fetch(0, 50, max_bytes=1 << 30)
    assert [b.payload for b in got] == [data(stream.stream_id, i, 500) for i in range(50)]
    await again.close()


async def test_expired_prepared_objects_are_deleted_from_the_bucket(
    tmp_path: Path, s3_server: S3TestServer, s3_prefix: str
) -> None:
    client = await open_client(tmp_path, bucket_uri=s3_server.uri(s3_prefix), config=CONFIG)
    metadata, storage = client.engine.metadata, client.engine.storage
    orphan = await metadata.prepare_objects(count=1, ttl_ms=200)
    key = object_key(orphan, CONFIG.namespace)
    await storage.put(key, b"an upload that crashed before its commit")
    await asyncio.sleep(0.3)
    reaper = PreparedObjectReaper(
        GarbageCollector(metadata, storage, namespace=CONFIG.namespace, retention_ms=0, orphan_ttl_ms=0)
    )
    assert orphan in await reaper.run_once()
    assert [o async for o in storage.list(key)] == []
    assert all(o.object_id != orphan for o in await metadata.list_objects([ObjectState.PREPARED]))
    await client.close()
