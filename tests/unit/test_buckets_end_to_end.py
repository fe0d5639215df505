"""Each placement strategy end to end through the client over two in-memory buckets (``mem://``):
appends, uploads, reads, compaction, GC and the orphan scan leave no orphan in either bucket; a
replicated bucket emptied by hand loses no record; a list that drops or moves a bucket is refused."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from s3stream.assembly import open_client
from s3stream.buckets.monitor import WEIGHTS_KEY
from s3stream.errors import ConflictError
from s3stream.storage.base import ObjectStorage
from s3stream.storage.local import LocalObjectStorage
from s3stream.storage.uri import open_storage
from tests.support.buckets_e2e import CONFIG, ingest, object_keys, read_all, run_scenario


def two_buckets() -> tuple[str, dict[int, ObjectStorage]]:
    names = [f"mb-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    return f"0@mem://{names[0]},1@mem://{names[1]}", {
        i: open_storage(f"mem://{n}") for i, n in enumerate(names)
    }


@pytest.mark.parametrize("strategy", ["round_robin", "failover", "replication", "sharding"])
async def test_each_strategy_end_to_end_leaves_no_orphan(tmp_path: Path, strategy: str) -> None:
    bucket_list, buckets = two_buckets()
    weights = {"data_buckets_weights": "0:1,1:3"} if strategy == "sharding" else {}
    seen = await run_scenario(tmp_path, bucket_list, strategy, buckets, **weights)
    ingest0, ingest1 = (len(seen["ingest"][b]) for b in (0, 1))
    if strategy == "round_robin":
        assert abs(ingest0 - ingest1) <= 1
        assert ingest0 >= 2
    elif strategy == "failover":
        assert ingest1 == 0
        assert ingest0 >= 4
    elif strategy == "replication":
        assert seen["ingest"][0] == seen["ingest"][1]
        assert seen["end"][0] == seen["end"][1]
    else:
        assert ingest1 == 3 * ingest0


async def test_a_replicated_bucket_emptied_by_hand_loses_no_record(tmp_path: Path) -> None:
    # local directories: they outlive the client (an in-memory bucket is dropped when it closes)
    bucket_list = f"0@file://{tmp_path}/b0,1@file://{tmp_path}/b1"
    buckets = {b: LocalObjectStorage(str(tmp_path / f"b{b}")) for b in (0, 1)}
    config = CONFIG.replace(data_buckets_strategy="replication")
    client = await open_client(tmp_path / "node", bucket_uri=bucket_list, config=config)
    try:
        streams = [await client.streams.create_and_open_stream() for _ in range(2)]
        await ingest(client, streams, 3)
        before = [await read_all(s) for s in streams]
        ids = [s.stream_id for s in streams]
    finally:
        await client.close()
    emptied = [info.key async for info in buckets[0].list("")]
    assert emptied
    await buckets[0].delete(emptied)
    client = await open_client(tmp_path / "node", bucket_uri=bucket_list, config=config)
    try:
        reopened = [await client.streams.open_stream(i, epoch=1) for i in ids]
        assert [await read_all(s) for s in reopened] == before
    finally:
        await client.close()


async def test_a_later_open_may_add_a_bucket_but_not_drop_or_move_one(tmp_path: Path) -> None:
    bucket_list, _ = two_buckets()
    client = await open_client(tmp_path, bucket_uri=bucket_list, config=CONFIG)
    await client.close()
    entries = bucket_list.split(",")
    third = f"2@mem://mb-{uuid.uuid4().hex[:8]}"
    for refused in (entries[0], f"{entries[1]},{entries[0]}", f"{entries[0]},1@mem://elsewhere"):
        with pytest.raises(ConflictError):
            await open_client(tmp_path, bucket_uri=refused, config=CONFIG)
    client = await open_client(tmp_path, bucket_uri=f"{bucket_list},{third}", config=CONFIG)
    await client.close()
    client = await open_client(tmp_path, config=CONFIG)  # the recorded list, the third bucket included
    try:
        assert client.engine.storage.bucket_ids == (0, 1, 2)  # type: ignore[attr-defined]
    finally:
        await client.close()


async def test_weights_changed_in_the_kv_apply_to_a_running_node(tmp_path: Path) -> None:
    bucket_list, buckets = two_buckets()
    config = CONFIG.replace(
        data_buckets_strategy="sharding", data_buckets_weights="0:1,1:0", data_buckets_weights_poll_ms=20
    )
    client = await open_client(tmp_path, bucket_uri=bucket_list, config=config)
    try:
        stream = await client.streams.create_and_open_stream()
        await ingest(client, [stream], 2)
        assert len(await object_keys(buckets[1], config.namespace)) == 0
        await client.engine.metadata.kv_put(WEIGHTS_KEY, b"0:0,1:1")  # what `buckets set-weights` writes
        await asyncio.sleep(0.2)
        before = await object_keys(buckets[0], config.namespace)
        await ingest(client, [stream], 3)
        assert await object_keys(buckets[0], config.namespace) == before
        assert len(await object_keys(buckets[1], config.namespace)) == 3
        assert len(await read_all(stream)) == 5 * 5
    finally:
        await client.close()
