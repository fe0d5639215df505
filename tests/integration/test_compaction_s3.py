"""Compaction on a real S3 server (Ceph RGW through the s3_server fixture): the UploadPartCopy path of
stream object merges, StreamSet compaction, and deletion of the replaced objects."""

from __future__ import annotations

from pathlib import Path

import pytest

from compaction.compactor import Compactor
from s3stream import RecordBatch
from s3stream.assembly import open_client
from s3stream.config import Config
from s3stream.engine.client import Client, Stream
from s3stream.ids import NodeId
from s3stream.metadata.base import ObjectState
from s3stream.objectformat import object_key
from s3stream.storage.base import MIN_PART_SIZE_BYTES
from tests.conftest import S3TestServer

pytestmark = pytest.mark.integration
KiB = 1024
MiB = 1024 * KiB

CONFIG = Config(
    wal_capacity_bytes=64 * MiB,
    wal_record_size_max_bytes=2 * MiB,
    record_size_max_bytes=1 * MiB,
    wal_cache_size_bytes=32 * MiB,
    wal_upload_threshold_bytes=16 * MiB,
    wal_upload_interval_ms=3_600_000,
    object_prepared_ttl_ms=60_000,
    object_delete_retention_minutes=0,
    upload_retry_backoff_ms=20,
)


def data(stream_id: int, base: int, size: int) -> bytes:
    head = f"{stream_id}:{base}:".encode()
    return (head * (size // len(head) + 1))[:size]


async def append(stream: Stream, count: int, size: int) -> None:
    for _ in range(count):
        base = stream.next_offset
        await stream.append(RecordBatch(data(stream.stream_id, base, size)))


async def read_all(stream: Stream) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    offset = stream.start_offset
    while offset < stream.confirm_offset:
        got = await stream.fetch(offset, stream.confirm_offset, max_bytes=8 * MiB)
        out += [(b.base_offset, b.payload) for b in got]
        offset = got[-1].end_offset
    return out


async def assert_bucket_matches_metadata(client: Client) -> None:
    committed = await client.engine.metadata.list_objects([ObjectState.COMMITTED])
    keys = {object_key(o.object_id, client.config.namespace) for o in committed}
    stored = {info.key async for info in client.engine.storage.list("")}
    assert stored == keys


def compactor(client: Client) -> Compactor:
    e = client.engine
    return Compactor(client.config, e.metadata, e.storage, node_id=e.node_id, node_epoch=e.node_epoch)


async def test_stream_object_merge_uses_upload_part_copy_for_ranges_of_5_mib_and_more(
    tmp_path: Path, s3_server: S3TestServer, s3_prefix: str
) -> None:
    # multipart from the first byte, so ranges >= 5 MiB become UploadPartCopy parts
    uri = s3_server.uri(s3_prefix) + "&multipartThresholdBytes=0"
    config = CONFIG.replace(stream_object_split_size_bytes=1)  # every upload: a stream object
    client = await open_client(tmp_path, bucket_uri=uri, config=config)
    try:
        stream = await client.streams.create_and_open_stream()
        for _ in range(3):
            await append(stream, 6, 1 * MiB)  # 6 MiB per object: copied server-side
            await client.engine.force_upload(None)
        await append(stream, 5, 20 * KiB)  # 100 KiB: read and rewritten
        await client.engine.force_upload(None)
        sources = await client.engine.metadata.get_stream_objects(
            stream_id=stream.stream_id, start_offset=0, end_offset=-1, limit=100
        )
        assert len(sources) == 4
        before = await read_all(stream)
        stats = client.engine.storage.stats  # type: ignore[attr-defined]
        stats.reset()
        report = await compactor(client).run_once(stream_objects=True)
        assert report.problems == ()
        assert report.stream_objects_merged == 4
        assert report.stream_objects_written == 1
        assert report.bytes_copied >= 3 * 6 * MiB
        assert stats.counts["upload_part_copy"] >= 3
        assert stats.bytes["get"] < MIN_PART_SIZE_BYTES  # tails and the small object only
        merged = await client.engine.metadata.get_stream_objects(
            stream_id=stream.stream_id, start_offset=0, end_offset=-1, limit=100
        )
        assert [(o.start_offset, o.end_offset) for o in merged] == [(0, stream.confirm_offset)]
        assert await read_all(stream) == before
        assert report.gc.deleted_count == 4
        await assert_bucket_matches_metadata(client)
    finally:
        await client.close()


async def test_stream_set_compaction_on_s3_keeps_every_record(
    tmp_path: Path, s3_server: S3TestServer, s3_prefix: str
) -> None:
    client = await open_client(tmp_path, bucket_uri=s3_server.uri(s3_prefix), config=CONFIG)
    try:
        streams = [await client.streams.create_and_open_stream() for _ in range(4)]
        for _ in range(4):
            for s in streams:
                await append(s, 10, 3 * KiB)
            await client.engine.force_upload(None)
        assert len(await client.engine.metadata.get_stream_set_objects(NodeId(0))) == 4
        before = [await read_all(s) for s in streams]
        report = await compactor(client).run_once()
        assert report.problems == ()
        assert report.stream_set_objects_compacted == 4
        assert len(await client.engine.metadata.get_stream_set_objects(NodeId(0))) == 1
        assert [await read_all(s) for s in streams] == before
        await assert_bucket_matches_metadata(client)
    finally:
        await client.close()
