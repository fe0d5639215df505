"""Cluster-wide KV: a KV change acknowledged on one node is what every node sharing the metadata reads,
and a node's WAL replay re-applies only the KV records that were not applied (the node's applied KV
WAL offset is written in the same metadata transaction as each record's changes)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import cast

import pytest

import s3stream
from s3stream import Client, RecordBatch
from s3stream.engine.recovery import plan_replay
from s3stream.engine.walbody import KvMutation, KvOp, encode_group, encode_kv, encode_plain
from s3stream.errors import CorruptionError, InvalidArgumentError
from s3stream.ids import NodeId, StreamId
from s3stream.metadata.base import KvWrite, MetadataStore, StreamMetadata, StreamState
from s3stream.metadata.memory import MemoryMetadataStore
from s3stream.metadata.sqlite import SqliteMetadataStore
from s3stream.metadata.stream_ops import kv_applied_key
from s3stream.metadata.url import open_metadata_store
from s3stream.record import StreamRecordBatch
from s3stream.storage.local import LocalObjectStorage
from tests.support.configs import small_config

NODE = NodeId(7)


@pytest.fixture(params=["memory", "sqlite", "postgresql"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[MetadataStore]:
    metadata: MetadataStore
    if request.param == "memory":
        metadata = MemoryMetadataStore()
    elif request.param == "sqlite":
        metadata = await SqliteMetadataStore.open(tmp_path / "metadata.db")
    else:
        metadata = cast(MetadataStore, await open_metadata_store(request.getfixturevalue("pg_url")))
    yield metadata
    await metadata.close()


async def test_kv_apply_applies_in_order_and_records_the_offset(store: MetadataStore) -> None:
    assert await store.kv_applied_offset(NODE) == -1
    await store.kv_put("gone", b"g")
    results = await store.kv_apply(
        [
            KvWrite("k", b"1"),
            KvWrite("k", b"2", overwrite=False),  # sees the put before it in the same record
            KvWrite("j", b"j", overwrite=False),
            KvWrite("gone", None),
            KvWrite("gone", b"back", overwrite=False),
            KvWrite("never", None),
        ],
        node_id=NODE,
        wal_offset=4096,
    )
    assert results == [b"1", b"1", b"j", b"g", b"back", None]
    assert [await store.kv_get(k) for k in ("k", "j", "gone", "never")] == [b"1", b"j", b"back", None]
    assert await store.kv_applied_offset(NODE) == 4096
    assert await store.kv_applied_offset(NodeId(8)) == -1  # per node
    assert await store.kv_apply([], node_id=NODE, wal_offset=-1) == []
    assert await store.kv_applied_offset(NODE) == -1


async def test_a_refused_kv_apply_writes_nothing(store: MetadataStore) -> None:
    await store.kv_apply([KvWrite("k", b"1")], node_id=NODE, wal_offset=10)
    for writes, wal_offset in [
        ([KvWrite("k", b"2"), KvWrite("", b"x")], 20),
        ([KvWrite("k", b"2"), KvWrite("big", bytes((1 << 20) + 1))], 20),
        ([KvWrite("k", b"2"), ("k", b"3")], 20),
        ([KvWrite("k", b"2")], -2),
        ([KvWrite("k", "text")], 20),
    ]:
        with pytest.raises(InvalidArgumentError):
            await store.kv_apply(writes, node_id=NODE, wal_offset=wal_offset)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        await store.kv_apply([], node_id=NodeId(-1), wal_offset=1)
    assert await store.kv_get("k") == b"1"
    assert await store.kv_applied_offset(NODE) == 10


async def test_a_damaged_applied_offset_is_a_corruption_error(store: MetadataStore) -> None:
    await store.kv_put(kv_applied_key(NODE), b"not a number")
    with pytest.raises(CorruptionError):
        await store.kv_applied_offset(NODE)


def opened(stream_id: int, end: int) -> StreamMetadata:
    return StreamMetadata(StreamId(stream_id), 1, StreamState.OPENED, 0, end)


def test_kv_records_at_or_below_the_applied_offset_are_not_replayed() -> None:
    wal = [
        (0, encode_group([StreamRecordBatch(1, 1, 0, 1, b"a")], [("k", b"old")])),
        (64, encode_kv([KvMutation(KvOp.PUT, "k", b"mid")])),
        (96, encode_plain(StreamRecordBatch(1, 1, 1, 1, b"b"))),
        (128, encode_kv([KvMutation(KvOp.PUT, "k", b"new"), KvMutation(KvOp.DELETE, "j")])),
    ]
    everything = plan_replay(wal, [opened(1, 0)])
    assert [offset for offset, _ in everything.kv_records] == [0, 64, 128]
    plan = plan_replay(wal, [opened(1, 0)], kv_applied_offset=64)
    assert plan.kv_records == ((128, (KvMutation(KvOp.PUT, "k", b"new"), KvMutation(KvOp.DELETE, "j"))),)
    assert plan.kv_ops == plan.kv_records[0][1]
    assert plan.records == everything.records  # batches replay as before
    assert plan_replay(wal, [opened(1, 0)], kv_applied_offset=128).kv_records == ()


async def open_node(tmp: Path, node_id: int, metadata_url: str | None = None) -> Client:
    """A node with its own data dir on the shared metadata (``metadata_url``, else the SQLite file of
    ``tmp``) and the bucket of ``tmp``."""
    metadata = cast(
        MetadataStore, await open_metadata_store(metadata_url or f"sqlite://{tmp / 'metadata.db'}")
    )
    storage = LocalObjectStorage(str(tmp / "objects"))
    return await s3stream.open(
        tmp / f"node{node_id}",
        config=small_config(node_id=node_id),
        metadata=metadata,
        storage=storage,
    )


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
async def test_a_kv_change_acknowledged_on_one_node_is_read_on_the_other(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    url = request.getfixturevalue("pg_url") if backend == "postgresql" else None
    one, two = await open_node(tmp_path, 1, url), await open_node(tmp_path, 2, url)
    try:
        await one.kv.put("k", b"from 1")
        assert await two.kv.get("k") == b"from 1"
        assert await two.kv.put_if_absent("k", b"from 2") == b"from 1"
        await two.kv.put("k", b"from 2")
        assert await one.kv.get("k") == b"from 2"
        stream = await one.streams.create_and_open_stream()
        await one.append_atomic([(stream, RecordBatch(b"x"))], kv={"progress": b"1", "k": b"atomic"})
        assert [await two.kv.get(k) for k in ("progress", "k")] == [b"1", b"atomic"]
        assert await two.kv.delete("progress") == b"1"
        assert await one.kv.get("progress") is None
        marks = [await one.engine.metadata.kv_applied_offset(NodeId(n)) for n in (1, 2)]
        assert all(mark >= 0 for mark in marks)
    finally:
        await one.close()
        await two.close()


async def test_a_new_wal_starts_with_no_applied_offset(tmp_path: Path) -> None:
    metadata = await SqliteMetadataStore.open(tmp_path / "metadata.db")
    # A mark left by the node's previous WAL (its data dir was lost): a new WAL's offsets start again.
    await metadata.kv_apply([], node_id=NodeId(1), wal_offset=1 << 40)
    await metadata.close()
    client = await open_node(tmp_path, 1)
    try:
        assert await client.engine.metadata.kv_applied_offset(NodeId(1)) == -1
        await client.kv.put("k", b"v")
        assert 0 <= await client.engine.metadata.kv_applied_offset(NodeId(1)) < 1 << 40
    finally:
        await client.close()
