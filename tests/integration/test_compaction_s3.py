"""Compaction on a real S3 server (Ceph RGW through the s3_server fixture): the UploadPartCopy path of
stream object merges, StreamSet compaction, deletion of the replaced objects, and peak memory within
the budget with the default S3 upload settings."""

from __future__ import annotations

import gc
import tracemalloc
from dataclasses import replace
from pathlib import Path

import pytest

from benchmarks.workloads.compaction import build_input
from compaction.compactor import Compactor
from s3stream import RecordBatch
from s3stream.assembly import open_client
from s3stream.config import Config
from s3stream.engine.client import Client, Stream
from s3stream.ids import NodeId
from s3stream.metacopy.objects import parse_copy_key
from s3stream.metadata.base import ObjectState
from s3stream.metadata.sqlite import SqliteMetadataStore
from s3stream.objectformat import ObjectReader, object_key
from s3stream.storage.base import MIN_PART_SIZE_BYTES
from s3stream.storage.retry import RetryPolicy
from s3stream.storage.s3 import S3ObjectStorage
from s3stream.storage.uri import parse_bucket_uri, s3_config_from_uri
from tests.support.s3 import S3TestServer

pytestmark = pytest.mark.integration
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
    """The bucket's objects are exactly the committed ones; every other key is the metadata copy's."""
    namespace = client.config.namespace
    committed = await client.engine.metadata.list_objects([ObjectState.COMMITTED])
    keys = {object_key(o.object_id, namespace) for o in committed}
    stored = [info.key async for info in client.engine.storage.list("")]
    copy_keys = {k for k in stored if parse_copy_key(namespace, k) is not None}
    assert copy_keys, "the metadata copy is on: its objects are in the bucket"
    assert set(stored) - copy_keys == keys


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


async def test_stream_set_compaction_with_default_s3_settings_stays_within_its_budget(
    tmp_path: Path, s3_server: S3TestServer, s3_prefix: str
) -> None:
    """Issue 5: 128 MiB of input (4x a 32 MiB budget) compacted through an S3 store with the default
    upload settings (16 MiB parts, 4 in flight, 32 MiB single PUT). Each upload is given its share of
    the budget as ``buffer_max_bytes``, so the traced peak stays within budget + 10 % (without the
    limits one StreamSet object upload alone may hold 80 MiB)."""
    budget = 32 * MiB
    config = Config(
        stream_set_object_compaction_cache_size_bytes=budget,
        object_part_size_bytes=5 * MiB,
        object_block_size_bytes=512 * KiB,
    )
    s3 = S3ObjectStorage(
        replace(
            s3_config_from_uri(parse_bucket_uri(s3_server.uri(s3_prefix))),
            retry=RetryPolicy(deadline_s=60, attempt_timeout_s=30),
        )
    )
    assert (s3.config.part_size_bytes, s3.config.part_concurrency_max) == (16 * MiB, 4)  # the defaults
    metadata = await SqliteMetadataStore.open(str(tmp_path / "metadata.db"))
    try:
        await build_input(metadata, s3, config, objects=8, streams=40, total_bytes=4 * budget)
        compactor = Compactor(config, metadata, s3, node_id=NodeId(0), node_epoch=1)
        gc.collect()
        tracemalloc.start()
        try:
            floor, _ = tracemalloc.get_traced_memory()
            tracemalloc.reset_peak()
            report = await compactor.run_once(stream_objects=False)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert report.problems == ()
        assert report.stream_set_objects_compacted == 8
        assert report.bytes_read >= 3 * budget
        assert peak - floor <= 1.1 * budget, (peak - floor) / MiB
        # every object the bucket holds is committed, and every committed one is readable
        committed = await metadata.list_objects([ObjectState.COMMITTED])
        for o in committed:
            await ObjectReader.open(s3, object_key(o.object_id, config.namespace), o.size_bytes)
    finally:
        await metadata.close()
        await s3.delete([info.key async for info in s3.list()])
        await s3.close()
