"""Each placement strategy end to end over two real buckets on the Ceph RGW (the test bucket and a
second one beside it): appends, uploads, reads, compaction, GC and the orphan scan leave no orphan in
either bucket; a replicated bucket emptied by hand loses no record; a remote reader reads through the
recorded placement."""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from benchmarks.harness import ensure_bucket
from s3stream.assembly import open_client, open_reader
from s3stream.buckets.storage import MultiBucketStorage
from s3stream.cli import main
from s3stream.metadata.base import ObjectState
from s3stream.storage.base import ObjectStorage
from tests.support.buckets_e2e import CONFIG, ingest, read_all, run_scenario
from tests.support.s3 import S3TestServer, delete_prefix

pytestmark = pytest.mark.integration


@pytest.fixture
async def second(s3_server: S3TestServer, s3_prefix: str) -> AsyncIterator[S3TestServer]:
    """A second bucket on the same server (created if missing); the test's prefix is emptied after."""
    other = dataclasses.replace(s3_server, bucket=f"{s3_server.bucket}-b")
    await ensure_bucket(other.bench_target())
    yield other
    delete_prefix(other, s3_prefix)


def bucket_list(first: S3TestServer, second: S3TestServer, prefix: str) -> str:
    return f"{first.uri(prefix)},{second.uri(prefix).replace('0@', '1@', 1)}"


@pytest.fixture
async def inspect(
    s3_server: S3TestServer, second: S3TestServer, s3_prefix: str
) -> AsyncIterator[dict[int, ObjectStorage]]:
    """A plain storage per bucket, to look at what each holds."""
    stores: dict[int, ObjectStorage] = {0: s3_server.storage(s3_prefix), 1: second.storage(s3_prefix)}
    yield stores
    for store in stores.values():
        await store.close()


@pytest.mark.parametrize("strategy", ["round_robin", "failover", "replication", "sharding"])
async def test_each_strategy_end_to_end_on_two_buckets(
    tmp_path: Path,
    strategy: str,
    s3_server: S3TestServer,
    second: S3TestServer,
    s3_prefix: str,
    inspect: dict[int, ObjectStorage],
) -> None:
    weights = {"data_buckets_weights": "0:1,1:3"} if strategy == "sharding" else {}
    seen = await run_scenario(
        tmp_path, bucket_list(s3_server, second, s3_prefix), strategy, inspect, **weights
    )
    ingest0, ingest1 = (len(seen["ingest"][b]) for b in (0, 1))
    if strategy == "round_robin":
        assert abs(ingest0 - ingest1) <= 1
    elif strategy == "failover":
        assert (ingest0, ingest1) == (ingest0, 0)
        assert ingest0 >= 4
    elif strategy == "replication":
        assert seen["ingest"][0] == seen["ingest"][1]
        assert seen["end"][0] == seen["end"][1]
    else:
        assert ingest1 == 3 * ingest0


async def test_a_replicated_bucket_emptied_by_hand_loses_no_record(
    tmp_path: Path,
    s3_server: S3TestServer,
    second: S3TestServer,
    s3_prefix: str,
    inspect: dict[int, ObjectStorage],
) -> None:
    buckets = bucket_list(s3_server, second, s3_prefix)
    config = CONFIG.replace(data_buckets_strategy="replication")
    client = await open_client(tmp_path, bucket_uri=buckets, config=config)
    try:
        streams = [await client.streams.create_and_open_stream() for _ in range(2)]
        await ingest(client, streams, 3)
        before = [await read_all(s) for s in streams]
        ids = [s.stream_id for s in streams]
    finally:
        await client.close()
    emptied = [info.key async for info in inspect[1].list("")]
    assert len(emptied) >= 3
    await inspect[1].delete(emptied)
    assert [info.key async for info in inspect[1].list("")] == []
    reader = await open_reader(
        bucket_uri=buckets, metadata_url=f"sqlite://{tmp_path / 'metadata.db'}", config=config
    )
    try:
        for stream_id, records in zip(ids, before, strict=True):
            got = await reader.fetch(stream_id, 0, records[-1][0] + 1, max_bytes=64 << 20)
            assert [(b.base_offset, b.payload) for b in got] == records
    finally:
        await reader.close()
    client = await open_client(tmp_path, bucket_uri=buckets, config=config)
    try:
        reopened = [await client.streams.open_stream(i, epoch=1) for i in ids]
        assert [await read_all(s) for s in reopened] == before
    finally:
        await client.close()


async def test_failover_with_an_unreachable_primary_loses_nothing_and_reports_it(
    tmp_path: Path,
    s3_server: S3TestServer,
    second: S3TestServer,
    s3_prefix: str,
    inspect: dict[int, ObjectStorage],
    unused_tcp_port: int,
) -> None:
    dead = dataclasses.replace(s3_server, endpoint=f"http://127.0.0.1:{unused_tcp_port}")
    buckets = bucket_list(dead, second, s3_prefix)
    config = CONFIG.replace(data_buckets_strategy="failover", data_buckets_request_timeout_ms=300)
    client = await open_client(tmp_path, bucket_uri=buckets, config=config)
    try:
        storage = client.engine.storage
        assert isinstance(storage, MultiBucketStorage)
        streams = [await client.streams.create_and_open_stream() for _ in range(2)]
        started = time.monotonic()
        await ingest(client, streams, 4)  # no error reaches the appends or the uploads
        elapsed_s = time.monotonic() - started
        print(f"ingest with a dead primary: {elapsed_s:.2f} s")
        before = [await read_all(s) for s in streams]
        assert sum(len(r) for r in before) == 2 * 4 * 5
        # the dead bucket is avoided as suspect at once; its probes (1 s apart) make it unhealthy
        deadline = time.monotonic() + 10
        while storage.stats()[0].healthy and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        stats = storage.stats()
        assert not stats[0].healthy
        assert stats[0].errors_recent >= config.data_buckets_failover_errors
        assert "secretKey" not in stats[0].last_error
        assert s3_server.secret_key not in stats[0].last_error
        assert stats[1].uploads_recent >= 4
        committed = await client.engine.metadata.list_objects([ObjectState.COMMITTED])
        placements = await client.engine.metadata.placements([o.object_id for o in committed])
        assert all(1 in placements[o.object_id] for o in committed)
        assert len([info async for info in inspect[1].list("")]) >= 4
        # each of the first uploads waits out the dead bucket's deadline (0.6 s) once, then none do
        assert elapsed_s < 10
    finally:
        await client.close()


async def test_a_data_dir_lost_with_its_metadata_is_restored_with_its_placements(
    tmp_path: Path,
    s3_server: S3TestServer,
    second: S3TestServer,
    s3_prefix: str,
    inspect: dict[int, ObjectStorage],
) -> None:
    buckets = bucket_list(s3_server, second, s3_prefix)
    config = CONFIG.replace(data_buckets_strategy="round_robin")
    lost, restored = tmp_path / "lost", tmp_path / "restored"
    client = await open_client(lost, bucket_uri=buckets, config=config)
    try:
        streams = [await client.streams.create_and_open_stream() for _ in range(2)]
        await ingest(client, streams, 4)
        before = [await read_all(s) for s in streams]
        ids = [s.stream_id for s in streams]
        committed = await client.engine.metadata.list_objects([ObjectState.COMMITTED])
        placed = await client.engine.metadata.placements([o.object_id for o in committed])
    finally:
        await client.close()
    assert {b for bs in placed.values() for b in bs} == {0, 1}  # objects in both buckets
    shutil.rmtree(lost)
    toml = tmp_path / "s3stream.toml"
    toml.write_text(f'"s3.namespace" = "{config.namespace}"\n')
    argv = ["restore", "--bucket-uri", buckets, "--data-dir", str(restored), "--config", str(toml), "--json"]
    assert await asyncio.to_thread(main, argv) == 0
    client = await open_client(restored, config=config)  # the recorded bucket list
    try:
        assert await client.engine.metadata.placements(list(placed)) == placed
        reopened = [await client.streams.open_stream(i, epoch=1) for i in ids]
        assert [await read_all(s) for s in reopened] == before
    finally:
        await client.close()


async def test_a_merge_copies_server_side_only_within_the_target_bucket(
    tmp_path: Path,
    s3_server: S3TestServer,
    second: S3TestServer,
    s3_prefix: str,
    inspect: dict[int, ObjectStorage],
) -> None:
    from compaction.compactor import Compactor
    from s3stream import RecordBatch

    # multipart from the first byte (as a merge of large stream objects is)
    buckets = ",".join(
        f"{u}&multipartThresholdBytes=0" for u in bucket_list(s3_server, second, s3_prefix).split(",")
    )
    config = CONFIG.replace(data_buckets_strategy="round_robin", stream_object_split_size_bytes=1)
    client = await open_client(tmp_path, bucket_uri=buckets, config=config)
    try:
        storage = client.engine.storage
        assert isinstance(storage, MultiBucketStorage)
        stream = await client.streams.create_and_open_stream()
        for _ in range(3):
            for _ in range(6):
                await stream.append(RecordBatch(b"x" * (1 << 20)))
            await client.engine.force_upload(None)
        sources = await client.engine.metadata.get_stream_objects(
            stream_id=stream.stream_id, start_offset=0, end_offset=-1, limit=100
        )
        assert len(sources) == 3
        placed = await client.engine.metadata.placements([o.object_id for o in sources])
        source_buckets = [placed[o.object_id][0] for o in sources]
        assert sorted(set(source_buckets)) == [0, 1]
        before = await read_all(stream)
        stats = {b: storage.bucket(b).stats for b in (0, 1)}  # type: ignore[attr-defined]
        for s in stats.values():
            s.reset()
        e = client.engine
        report = await Compactor(
            config, e.metadata, e.storage, node_id=e.node_id, node_epoch=e.node_epoch
        ).run_once(stream_objects=True)
        assert report.problems == ()
        assert report.stream_objects_merged == 3
        (merged,) = await e.metadata.get_stream_objects(
            stream_id=stream.stream_id, start_offset=0, end_offset=-1, limit=100
        )
        (target,) = (await e.metadata.placements([merged.object_id]))[merged.object_id]
        same = source_buckets.count(target)
        other = 1 - target
        # the target bucket's upload is handed a copy (UploadPartCopy where its part layout allows) for
        # each source it holds; the other bucket's sources are read and written, never copied
        assert stats[target].counts["copy"] == same
        assert stats[other].counts["copy"] == 0
        assert stats[other].counts["upload_part_copy"] == 0
        assert stats[other].bytes["get"] >= (3 - same) * 6 * (1 << 20)  # read, then written to the target
        assert await read_all(stream) == before
    finally:
        await client.close()
