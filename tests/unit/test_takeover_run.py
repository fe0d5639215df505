"""The taker's run over a real dead WAL, a real SQLite store and a local bucket.

The dead node's WAL holds record batches of two streams (the first part already committed by the dead
node) and KV records (one applied before the "crash", one not). The run must commit exactly the
uncommitted batches as the taker's objects, in several groups, apply only the unapplied KV record for
the dead node, and a second run after a failed first one must finish without duplicating anything.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from s3stream.assembly import build_reader, open_block_wal
from s3stream.cluster.takeover import TakeoverObserver, run_takeover
from s3stream.engine.kvlog import apply_record
from s3stream.engine.upload import ObjectUploader, StreamRecords, plan_upload
from s3stream.engine.walbody import KvMutation, KvOp, encode_kv, encode_plain
from s3stream.errors import ConflictError
from s3stream.ids import NodeId, StreamId
from s3stream.metadata.base import StreamState, TakeoverInfo, TakeoverState
from s3stream.metadata.sqlite import SqliteMetadataStore
from s3stream.record import StreamRecordBatch
from s3stream.storage.local import LocalObjectStorage
from tests.support.configs import small_config
from tests.support.metadata_contract import FakeClock

DEAD, TAKER = NodeId(1), NodeId(2)
LEASE_MS = 10_000
PAYLOAD_BYTES = 1000
CONFIG = small_config(node_id=DEAD, wal_aio="off", wal_upload_threshold_bytes=64 * 1024)
"""The taker's config: upload groups of 64 KiB (the dead WAL holds ~200 KB to replay)."""
World = tuple[SqliteMetadataStore, LocalObjectStorage, FakeClock, list[StreamId], str]


def _payload(stream_id: int, offset: int) -> bytes:
    return f"{stream_id}-{offset}-".encode().ljust(PAYLOAD_BYTES, b"x")


class FailAfterFirstCommit(TakeoverObserver):
    async def after_commit(self, takeover: TakeoverInfo, commit_count: int) -> None:
        raise RuntimeError("the taker dies here")


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    """Node 1 dead (lease lapsed) with two OPENED streams whose WAL is at the returned path; node 2 live."""
    clock = FakeClock()
    store = await SqliteMetadataStore.open(str(tmp_path / "metadata.db"), clock_ms=clock)
    storage = LocalObjectStorage(str(tmp_path / "objects"))
    wal_path = str(tmp_path / "dead-wal")
    dead = await store.open_node(node_id=DEAD, lease_ms=LEASE_MS, wal_path=wal_path)
    streams = []
    for _ in range(2):
        sid = await store.create_stream(node_id=DEAD, node_epoch=dead.node_epoch)
        await store.open_stream(node_id=DEAD, node_epoch=dead.node_epoch, stream_id=sid, epoch=0)
        streams.append(sid)
    wal = await open_block_wal(Path(wal_path), CONFIG, node_epoch=dead.node_epoch)
    applied = encode_kv([KvMutation(KvOp.PUT, "applied", b"old")])
    pending = encode_kv([KvMutation(KvOp.PUT, "pending", b"v1")])
    kv_offsets = [await wal.append([applied])]
    for offset in range(100):
        for sid in streams:
            await wal.append([encode_plain(StreamRecordBatch(sid, 0, offset, 1, _payload(sid, offset)))])
    kv_offsets.append(await wal.append([pending]))
    # Before the crash: the first KV record was applied, and stream 0's first 20 records committed.
    await apply_record(
        store, [KvMutation(KvOp.PUT, "applied", b"old")], node_id=DEAD, wal_offset=kv_offsets[0]
    )
    await store.kv_put("applied", b"newer, by another node")
    uploader = ObjectUploader(storage=storage, metadata=store, namespace=CONFIG.namespace, node_id=DEAD,
                              node_epoch=dead.node_epoch, block_size_bytes=CONFIG.object_block_size_bytes,
                              part_size_bytes=CONFIG.object_part_size_bytes, prepared_ttl_ms=60_000)  # fmt: skip
    first = StreamRecords.of(streams[0], [(streams[0], 0, o, 1, _payload(streams[0], o)) for o in range(20)])
    plan = plan_upload([first], split_size_bytes=CONFIG.stream_object_split_size_bytes)
    await store.commit_stream_set_object(await uploader.write(plan, await uploader.prepare(plan)))
    await wal.close()
    taker = await store.open_node(node_id=TAKER, lease_ms=3 * LEASE_MS)
    clock.advance(LEASE_MS)  # node 1's lease lapsed
    await store.start_takeover(node_id=DEAD, node_epoch=dead.node_epoch, taker_node_id=TAKER,
                               taker_node_epoch=taker.node_epoch)  # fmt: skip
    store.bind_node(TAKER, taker.node_epoch)
    yield store, storage, clock, streams, wal_path
    await storage.close()
    await store.close()


async def _read_all(store: SqliteMetadataStore, storage: LocalObjectStorage, sid: StreamId) -> list[bytes]:
    meta = await store.describe_stream(sid)
    reader = build_reader(CONFIG, store, storage)
    try:
        out, offset = [], 0
        while offset < meta.end_offset:
            for batch in await reader.read(sid, offset, meta.end_offset, 1 << 20):
                out.append(batch.payload)
                offset = batch.base_offset + batch.count
        return out
    finally:
        await reader.close()


async def _takeover(store: SqliteMetadataStore) -> TakeoverInfo:
    [info] = [t for t in await store.list_takeovers() if t.node_id == DEAD]
    return info


async def test_a_run_commits_what_was_not_committed_and_applies_what_was_not_applied(
    world: World,
) -> None:
    store, storage, _, streams, wal_path = world
    before = Path(wal_path).read_bytes()
    taker_epoch = (store.bound_session or (0, 0))[1]
    result = await run_takeover(
        await _takeover(store),
        metadata=store,
        storage=storage,
        config=CONFIG,
        node_id=TAKER,
        node_epoch=taker_epoch,
    )
    assert Path(wal_path).read_bytes() == before, "the dead WAL was written"
    assert result.batch_count == 80 + 100
    assert result.commit_count >= 2, "several upload groups"
    assert result.kv_record_count == 1
    assert await store.kv_get("pending") == b"v1"
    assert await store.kv_get("applied") == b"newer, by another node"  # not undone by a replay
    assert await store.kv_applied_offset(DEAD) == result.wal_end_offset - 1
    done = await _takeover(store)
    assert (done.state, done.wal_end_offset) == (TakeoverState.DONE, result.wal_end_offset)
    for sid in streams:
        meta = await store.describe_stream(sid)
        assert (meta.state, meta.end_offset) == (StreamState.CLOSED, 100)
        assert await _read_all(store, storage, sid) == [_payload(sid, o) for o in range(100)]
    assert len(await store.list_objects()) >= 3
    with pytest.raises(ConflictError):  # DONE: nothing left to run
        await run_takeover(
            done, metadata=store, storage=storage, config=CONFIG, node_id=TAKER, node_epoch=taker_epoch
        )


async def test_a_run_that_failed_mid_way_is_finished_by_the_next_without_duplicates(
    world: World,
) -> None:
    store, storage, _, streams, _ = world
    taker_epoch = (store.bound_session or (0, 0))[1]
    with pytest.raises(RuntimeError):
        await run_takeover(
            await _takeover(store), metadata=store, storage=storage, config=CONFIG, node_id=TAKER,
            node_epoch=taker_epoch, observer=FailAfterFirstCommit(),
        )  # fmt: skip
    partial = [(await store.describe_stream(sid)).end_offset for sid in streams]
    assert partial[0] >= 20, partial
    assert sum(partial) < 200, partial
    result = await run_takeover(
        await _takeover(store),
        metadata=store,
        storage=storage,
        config=CONFIG,
        node_id=TAKER,
        node_epoch=taker_epoch,
    )
    assert result.batch_count == 200 - sum(partial)
    assert result.kv_record_count == 0, "applied by the first run"
    for sid in streams:
        assert await _read_all(store, storage, sid) == [_payload(sid, o) for o in range(100)]
