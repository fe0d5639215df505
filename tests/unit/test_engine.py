"""The engine's public API on in-memory twins: append, fetch, trim, close, epochs, KV, uploads."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from s3stream.assembly import build_reader
from s3stream.config import Config
from s3stream.engine.client import Client
from s3stream.engine.core import Engine, UploadObserver
from s3stream.engine.pipeline import FROZEN_STREAMS_PER_TURN
from s3stream.engine.walport import MemoryWal
from s3stream.errors import (
    CapacityError,
    ClosedError,
    FencedError,
    InvalidArgumentError,
    NotFoundError,
    NotOwnerError,
    OffsetOutOfRangeError,
    UnavailableError,
)
from s3stream.ids import NodeId
from s3stream.metadata.base import ObjectState
from s3stream.metadata.memory import MemoryMetadataStore
from s3stream.model import FetchedBatch, RecordBatch
from s3stream.record import StreamRecordBatch
from s3stream.storage.base import Upload
from s3stream.storage.memory import MemoryObjectStorage
from tests.support.configs import small_config
from tests.support.wal import FaultyMemoryWal

KiB = 1024
MiB = 1024 * KiB

SMALL = small_config(
    wal_cache_size_bytes=2 * MiB,
    wal_upload_threshold_bytes=256 * KiB,
    wal_upload_interval_ms=60_000,
    upload_retry_backoff_ms=5,
    upload_retry_backoff_max_ms=20,
    append_backpressure_wait_ms=0,
    stream_object_split_size_bytes=128 * KiB,
)


class Node:
    """One engine on shared twins; ``restart()`` simulates a process restart on the same WAL."""

    def __init__(
        self,
        config: Config = SMALL,
        *,
        wal: MemoryWal | None = None,
        metadata: MemoryMetadataStore | None = None,
        storage: MemoryObjectStorage | None = None,
        node_id: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.clock = clock
        self.wal = wal or FaultyMemoryWal(capacity_bytes=config.wal_capacity_bytes)
        self.metadata = metadata or MemoryMetadataStore()
        self.storage = storage or MemoryObjectStorage()
        self.node_id = node_id
        self.epoch = 0

    async def open(self) -> Client:
        self.epoch += 1
        engine = Engine(
            self.config,
            wal=self.wal.reopen(),
            metadata=self.metadata,
            storage=self.storage,
            node_id=NodeId(self.node_id),
            node_epoch=self.epoch,
            reader=build_reader(self.config, self.metadata, self.storage),
            clock=self.clock,
        )
        await engine.start()
        return Client(engine, self.metadata, closers=[self.wal.close])


async def test_append_returns_consecutive_offsets_and_fetch_reads_them() -> None:
    client = await Node().open()
    stream = await client.streams.create_and_open_stream()
    assert (stream.start_offset, stream.confirm_offset, stream.next_offset) == (0, 0, 0)
    assert await stream.append(RecordBatch(b"a")) == 0
    assert await stream.append(RecordBatch(b"bc", count=2)) == 1
    assert await stream.append(RecordBatch(b"d")) == 3
    assert stream.confirm_offset == 4 == stream.next_offset
    got = await stream.fetch(0, 4)
    assert [(b.base_offset, b.count, b.payload) for b in got] == [(0, 1, b"a"), (1, 2, b"bc"), (3, 1, b"d")]
    # a batch containing start_offset is returned whole
    got = await stream.fetch(2, 3)
    assert [(b.base_offset, b.payload) for b in got] == [(1, b"bc")]
    assert await stream.fetch(4, 4) == []
    await client.close()


async def test_fetch_returns_the_records_themselves_from_cache_and_from_objects() -> None:
    client = await Node().open()
    stream = await client.streams.create_and_open_stream()
    for i in range(3):
        await stream.append(RecordBatch(bytes([i]) * 100))
    from_cache = await stream.fetch(0, 3)
    await client.engine.force_upload(None)
    from_objects = await stream.fetch(0, 3)
    for got in (from_cache, from_objects):
        # the engine's own records (a FetchedBatch subclass with stream id and epoch), not copies
        assert all(type(b) is StreamRecordBatch and isinstance(b, FetchedBatch) for b in got)
        assert [(b.stream_id, b.epoch) for b in got] == [(stream.stream_id, stream.epoch)] * 3
        assert [(b.base_offset, b.end_offset, b.payload) for b in got] == [
            (i, i + 1, bytes([i]) * 100) for i in range(3)
        ]
    from_cache.clear()  # the caller owns the list: the next fetch is unaffected
    assert len(await stream.fetch(0, 3)) == 3
    await client.close()


async def test_fetch_outside_range_and_bad_arguments_raise_typed_errors() -> None:
    client = await Node().open()
    stream = await client.streams.create_and_open_stream()
    await stream.append(RecordBatch(b"x"))
    with pytest.raises(OffsetOutOfRangeError):
        await stream.fetch(0, 2)
    with pytest.raises(InvalidArgumentError):
        await stream.fetch(1, 0)
    with pytest.raises(InvalidArgumentError):
        await stream.fetch(0, 1, max_bytes=0)
    with pytest.raises(InvalidArgumentError):
        await stream.append(RecordBatch(b""))
    with pytest.raises(InvalidArgumentError):
        await stream.append(RecordBatch(b"x" * (SMALL.record_max_bytes + 1)))
    with pytest.raises(InvalidArgumentError):
        await stream.append(b"raw bytes")  # type: ignore[arg-type]
    await client.close()


async def test_max_bytes_is_a_hint_returning_at_least_one_batch() -> None:
    client = await Node().open()
    stream = await client.streams.create_and_open_stream()
    for i in range(10):
        await stream.append(RecordBatch(bytes([i]) * 100))
    got = await stream.fetch(0, 10, max_bytes=1)
    assert [b.base_offset for b in got] == [0]
    got = await stream.fetch(0, 10, max_bytes=250)
    assert [b.base_offset for b in got] == [0, 1, 2]
    await client.close()


async def test_closed_stream_and_client_refuse_work() -> None:
    client = await Node().open()
    stream = await client.streams.create_and_open_stream()
    await stream.append(RecordBatch(b"x"))
    await stream.close()
    with pytest.raises(ClosedError):
        await stream.append(RecordBatch(b"y"))
    with pytest.raises(ClosedError):
        await stream.fetch(0, 1)
    await client.close()
    with pytest.raises(ClosedError):
        await client.kv.get("k")


async def test_close_forces_data_up_and_reopen_reads_from_objects() -> None:
    node = Node()
    client = await node.open()
    stream = await client.streams.create_and_open_stream()
    payloads = [f"record-{i}".encode() for i in range(50)]
    for p in payloads:
        await stream.append(RecordBatch(p))
    await stream.close()
    assert client.engine.stats.uploads >= 1
    objects = await node.metadata.list_objects([ObjectState.COMMITTED])
    assert objects
    # The WAL is trimmed after the commit.
    assert node.wal.records == {}
    again = await client.streams.open_stream(stream.stream_id, epoch=0)
    assert again.confirm_offset == 50
    # Drop the cache so the read must go to object storage.
    client.engine.cache.try_real_free(target_bytes=0)
    got = await again.fetch(0, 50, max_bytes=1 << 20)
    assert [b.payload for b in got] == payloads
    await client.close()


async def test_open_with_stale_epoch_is_fenced_and_newer_epoch_fences_the_old_owner() -> None:
    metadata = MemoryMetadataStore()
    storage = MemoryObjectStorage()
    one = await Node(metadata=metadata, storage=storage, node_id=1).open()
    two = await Node(metadata=metadata, storage=storage, node_id=2).open()
    s1 = await one.streams.create_and_open_stream(epoch=3)
    await s1.append(RecordBatch(b"from-one"))
    with pytest.raises(FencedError):
        await two.streams.open_stream(s1.stream_id, epoch=2)
    with pytest.raises(NotOwnerError) as refused:  # still open on node 1, which is alive
        await two.streams.open_stream(s1.stream_id, epoch=4)
    assert refused.value.owner_node_id == 1
    await s1.close()
    s2 = await two.streams.open_stream(s1.stream_id, epoch=4)
    assert s2.confirm_offset == 1
    assert await s2.append(RecordBatch(b"from-two")) == 1
    with pytest.raises(FencedError):
        await one.streams.open_stream(s1.stream_id, epoch=3)
    await s2.close()
    await one.close()
    await two.close()


async def test_open_unknown_stream_is_not_found() -> None:
    client = await Node().open()
    with pytest.raises(NotFoundError):
        await client.streams.open_stream(12345, epoch=0)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        await client.streams.open_stream(0, epoch=-1)  # type: ignore[arg-type]
    await client.close()


async def test_trim_moves_start_offset_and_bounds_fetch() -> None:
    client = await Node().open()
    stream = await client.streams.create_and_open_stream()
    for i in range(5):
        await stream.append(RecordBatch(bytes([i])))
    await stream.trim(3)
    assert stream.start_offset == 3
    with pytest.raises(OffsetOutOfRangeError):
        await stream.fetch(2, 4)
    assert [b.base_offset for b in await stream.fetch(3, 5)] == [3, 4]
    await stream.trim(1)  # lower than the start: no-op
    assert stream.start_offset == 3
    with pytest.raises(OffsetOutOfRangeError):
        await stream.trim(6)
    listed = {m.stream_id: m for m in await client.streams.list_streams()}
    assert listed[stream.stream_id].start_offset == 3
    await client.close()


async def test_destroy_removes_the_stream() -> None:
    client = await Node().open()
    stream = await client.streams.create_and_open_stream(tags={"topic": "t"})
    await stream.append(RecordBatch(b"x"))
    await stream.destroy()
    assert stream.stream_id not in {m.stream_id for m in await client.streams.list_streams()}
    with pytest.raises(ClosedError):
        await stream.append(RecordBatch(b"y"))
    await client.close()


async def test_kv_client() -> None:
    client = await Node().open()
    assert await client.kv.get("a") is None
    assert await client.kv.put_if_absent("a", b"1") == b"1"
    assert await client.kv.put_if_absent("a", b"2") == b"1"
    assert await client.kv.put("a", b"3") == b"3"
    assert await client.kv.get("a") == b"3"
    assert await client.kv.delete("a") == b"3"
    assert await client.kv.delete("a") is None
    with pytest.raises(InvalidArgumentError):
        await client.kv.put("", b"x")
    with pytest.raises(InvalidArgumentError):
        await client.kv.put("k", "str")  # type: ignore[arg-type]
    await client.close()


async def test_kv_key_that_is_not_encodable_utf8_is_an_invalid_argument() -> None:
    client = await Node().open()
    lone_surrogate = "key-\ud800"
    for call in (
        client.kv.put(lone_surrogate, b"x"),
        client.kv.put_if_absent(lone_surrogate, b"x"),
        client.kv.get(lone_surrogate),
        client.kv.delete(lone_surrogate),
    ):
        with pytest.raises(InvalidArgumentError, match="UTF-8"):
            await call
    stream = await client.streams.create_and_open_stream()
    with pytest.raises(InvalidArgumentError, match="UTF-8"):
        await client.append_atomic([(stream, RecordBatch(b"a"))], kv={lone_surrogate: b"x"})
    assert stream.next_offset == 0
    await client.close()


async def test_append_atomic_writes_one_wal_record_and_applies_kv() -> None:
    node = Node()
    client = await node.open()
    a = await client.streams.create_and_open_stream()
    b = await client.streams.create_and_open_stream()
    await a.append(RecordBatch(b"a0"))
    before = node.wal.append_count
    bases = await client.append_atomic(
        [(a, RecordBatch(b"a1")), (b, RecordBatch(b"b0", count=3)), (a, RecordBatch(b"a2"))],
        kv={"ckpt": b"7"},
    )
    assert bases == [1, 0, 2]
    assert node.wal.append_count == before + 1
    assert await client.kv.get("ckpt") == b"7"
    assert [x.payload for x in await a.fetch(0, 3)] == [b"a0", b"a1", b"a2"]
    assert [x.payload for x in await b.fetch(0, 3)] == [b"b0"]
    with pytest.raises(InvalidArgumentError):
        await client.append_atomic([])
    other = await Node(metadata=node.metadata, storage=node.storage, node_id=3).open()
    foreign = await other.streams.create_and_open_stream()
    with pytest.raises(InvalidArgumentError, match="another client"):
        await client.append_atomic([(a, RecordBatch(b"x")), (foreign, RecordBatch(b"y"))])
    await other.close()
    big = RecordBatch(b"x" * (400 * KiB))
    with pytest.raises(InvalidArgumentError):  # above the WAL record max (1 MiB) together
        await client.append_atomic([(a, big), (b, big), (a, big)])
    assert a.next_offset == 3  # nothing was assigned
    await client.close()


async def test_wal_failure_fences_the_stream_and_later_appends_fail() -> None:
    node = Node()
    client = await node.open()
    stream = await client.streams.create_and_open_stream()
    await stream.append(RecordBatch(b"ok"))
    node.wal.fail_next = UnavailableError("disk gone")
    with pytest.raises(UnavailableError):
        await stream.append(RecordBatch(b"lost"))
    with pytest.raises(FencedError):
        await stream.append(RecordBatch(b"after"))
    with pytest.raises(FencedError):
        await stream.fetch(0, 1)
    other = await client.streams.create_and_open_stream()
    assert await other.append(RecordBatch(b"fine")) == 0
    await client.close()


async def test_acknowledgements_are_in_offset_order_per_stream() -> None:
    node = Node()
    client = await node.open()
    stream = await client.streams.create_and_open_stream()
    node.wal.gate = asyncio.Event()
    order: list[int] = []

    async def one(i: int) -> None:
        base = await stream.append(RecordBatch(bytes([i])))
        order.append(base)

    tasks = [asyncio.create_task(one(i)) for i in range(20)]
    await asyncio.sleep(0.01)
    assert order == []
    assert stream.confirm_offset == 0
    assert stream.next_offset == 20
    node.wal.gate.set()
    await asyncio.gather(*tasks)
    assert order == list(range(20))
    await client.close()


async def test_upload_threshold_builds_one_stream_set_object_and_stream_objects() -> None:
    node = Node()
    client = await node.open()
    small = [await client.streams.create_and_open_stream() for _ in range(3)]
    big = await client.streams.create_and_open_stream()
    for i in range(30):
        for s in small:
            await s.append(RecordBatch(bytes([i]) * 1000))
    for _ in range(3):
        await big.append(RecordBatch(b"B" * (50 * KiB)))  # 150 KiB >= split size 128 KiB
    await client.engine.force_upload(None)
    ssos = await node.metadata.get_stream_set_objects(NodeId(0))
    assert len(ssos) == 1
    assert [r.stream_id for r in ssos[0].ranges] == sorted(s.stream_id for s in small)
    sos = await node.metadata.get_stream_objects(
        stream_id=big.stream_id, start_offset=0, end_offset=3, limit=10
    )
    assert [(o.start_offset, o.end_offset) for o in sos] == [(0, 3)]
    await client.close()


async def test_full_cache_gives_capacity_error_when_storage_is_down() -> None:
    node = Node(SMALL.replace(wal_cache_size_bytes=1 * MiB, wal_upload_threshold_bytes=256 * KiB))
    client = await node.open()
    stream = await client.streams.create_and_open_stream()

    real_upload = node.storage.upload

    def down(key: str) -> Upload:
        upload = real_upload(key)

        async def fail() -> int:
            raise UnavailableError("storage down")

        upload.complete = fail  # type: ignore[method-assign]
        return upload

    node.storage.upload = down  # type: ignore[method-assign]
    acked = 0
    rejected = None
    for _ in range(200):
        try:
            await stream.append(RecordBatch(b"z" * (20 * KiB)))
        except CapacityError as exc:
            rejected = exc
            break
        acked += 1
    assert rejected is not None
    assert rejected.retriable
    assert "uploads are failing, retried: " in str(rejected)
    assert "storage down" in str(rejected)
    assert 20 <= acked < 200
    assert client.engine.stats.upload_retries > 0
    del node.storage.upload  # storage back
    await client.engine.force_upload(None)
    assert len(await stream.fetch(0, acked, max_bytes=1 << 30)) == acked
    await client.close()


async def test_restart_keeps_the_kv_order_of_atomic_groups_and_later_plain_mutations() -> None:
    """Regression: replaying an atomic group's KV put used to overwrite a newer plain ``kv.put``
    (plain mutations went straight to metadata, atomic ones through the WAL)."""
    node = Node(SMALL.replace(wal_upload_threshold_bytes=2 * MiB))
    client = await node.open()
    stream = await client.streams.create_and_open_stream(epoch=1)
    await client.append_atomic([(stream, RecordBatch(b"a"))], kv={"k": b"old", "gone": b"x", "kept": b"1"})
    assert await client.kv.put("k", b"new") == b"new"
    assert await client.kv.delete("gone") == b"x"
    assert await client.kv.put_if_absent("kept", b"2") == b"1"
    assert await client.kv.put_if_absent("fresh", b"f") == b"f"
    # Crash between the two: the atomic group is still in the WAL (nothing was uploaded).
    assert await node.metadata.list_objects([ObjectState.COMMITTED]) == []
    client.engine.abandon()
    again = await node.open()
    assert await again.kv.get("k") == b"new"
    assert await again.kv.get("gone") is None
    assert await again.kv.get("kept") == b"1"
    assert await again.kv.get("fresh") == b"f"
    await again.close()


async def test_kv_changes_are_wal_records_and_oversized_ones_are_refused() -> None:
    node = Node()
    client = await node.open()
    before = node.wal.append_count
    await client.kv.put("a", b"1")
    await client.kv.put_if_absent("a", b"2")
    await client.kv.delete("a")
    assert node.wal.append_count == before + 3
    with pytest.raises(InvalidArgumentError, match=r"s3\.wal\.record\.size\.max"):
        await client.kv.put("big", bytes(SMALL.wal_record_max_bytes))
    assert node.wal.append_count == before + 3
    assert await client.kv.get("big") is None
    await client.close()


async def test_restart_replays_the_wal_and_uploads_it() -> None:
    node = Node(SMALL.replace(wal_upload_threshold_bytes=2 * MiB))
    client = await node.open()
    stream = await client.streams.create_and_open_stream(epoch=5)
    for i in range(40):
        await stream.append(RecordBatch(f"r{i}".encode()))
    await client.append_atomic([(stream, RecordBatch(b"atomic"))], kv={"k": b"v"})
    # Crash: nothing was uploaded, the engine is abandoned without close.
    assert await node.metadata.list_objects([ObjectState.COMMITTED]) == []
    client.engine.abandon()
    # Pretend the KV put had not reached metadata: neither its change nor its applied mark.
    await node.metadata.kv_delete("k")
    await node.metadata.kv_apply([], node_id=NodeId(node.node_id), wal_offset=-1)
    again = await node.open()
    assert again.engine.stats.recovered_records == 41
    assert await again.kv.get("k") == b"v"
    assert node.wal.records == {}
    s = await again.streams.open_stream(stream.stream_id, epoch=5)
    assert s.confirm_offset == 41
    got = await s.fetch(0, 41, max_bytes=1 << 30)
    assert [b.payload for b in got] == [f"r{i}".encode() for i in range(40)] + [b"atomic"]
    assert await s.append(RecordBatch(b"next")) == 41
    await again.close()


async def test_interval_trigger_uploads_an_old_active_block() -> None:
    node = Node(SMALL.replace(wal_upload_interval_ms=100))
    client = await node.open()
    stream = await client.streams.create_and_open_stream()
    await stream.append(RecordBatch(b"tick"))
    assert client.engine.stats.uploads == 0
    for _ in range(500):  # the upload commits, then the WAL trim follows in its own task
        await asyncio.sleep(0.01)
        if client.engine.stats.uploads and not node.wal.records:
            break
    assert client.engine.stats.uploads == 1
    assert node.wal.records == {}
    await client.close()


async def test_a_dead_background_task_fails_pending_work_instead_of_hanging() -> None:
    node = Node()
    client = await node.open()
    stream = await client.streams.create_and_open_stream()
    await stream.append(RecordBatch(b"x"))

    async def broken(*args: object) -> None:
        raise RuntimeError("bug in the uploader")

    client.engine.uploader.prepare = broken  # type: ignore[assignment,method-assign]
    with pytest.raises(UnavailableError, match="died"):
        await asyncio.wait_for(client.engine.force_upload(None), timeout=5)
    with pytest.raises(UnavailableError):
        await stream.append(RecordBatch(b"y"))
    assert node.wal.records, "nothing acknowledged was trimmed: it replays on restart"
    client.engine.abandon()
    again = await node.open()
    s = await again.streams.open_stream(stream.stream_id, epoch=0)
    assert [b.payload for b in await s.fetch(0, 1)] == [b"x"]
    await again.close()


async def test_commit_drops_a_stream_taken_over_meanwhile_and_commits_the_others() -> None:
    node = Node()
    client = await node.open()
    keep = await client.streams.create_and_open_stream()
    lost = await client.streams.create_and_open_stream()
    await keep.append(RecordBatch(b"keep"))
    await lost.append(RecordBatch(b"lost"))
    # Another node takes the stream over (as after a failover closed it for us).
    await node.metadata.close_stream(
        node_id=NodeId(0), node_epoch=node.epoch, stream_id=lost.stream_id, epoch=0
    )
    other = await Node(metadata=node.metadata, storage=node.storage, node_id=7).open()
    taken = await other.streams.open_stream(lost.stream_id, epoch=1)
    await client.engine.force_upload(None)
    (meta,) = [m for m in await client.streams.list_streams() if m.stream_id == keep.stream_id]
    assert meta.end_offset == 1
    with pytest.raises(FencedError):
        await lost.append(RecordBatch(b"more"))
    assert await keep.append(RecordBatch(b"more")) == 1
    assert taken.confirm_offset == 0  # the old owner's uncommitted batch is not the new owner's data
    await other.close()
    await client.close()


async def test_close_with_storage_down_gives_up_after_the_timeout_and_keeps_the_wal() -> None:
    node = Node(SMALL.replace(close_timeout_ms=300))
    client = await node.open()
    stream = await client.streams.create_and_open_stream()
    await stream.append(RecordBatch(b"kept"))

    def down(key: str) -> Upload:
        raise UnavailableError("storage down")

    node.storage.upload = down  # type: ignore[method-assign]
    await asyncio.wait_for(client.close(), timeout=5)
    assert node.wal.records, "the WAL still holds the batch"
    del node.storage.upload
    again = await node.open()
    assert again.engine.stats.recovered_records == 1
    await again.close()


async def test_a_wal_append_stuck_past_the_timeout_fails_the_engine() -> None:
    node = Node(SMALL.replace(wal_append_timeout_ms=200))
    client = await node.open()
    stream = await client.streams.create_and_open_stream()
    node.wal.gate = asyncio.Event()  # the device hangs
    with pytest.raises(ClosedError):
        await asyncio.wait_for(stream.append(RecordBatch(b"stuck")), timeout=5)
    with pytest.raises(UnavailableError, match="did not complete"):
        await stream.append(RecordBatch(b"after"))
    await client.close()


async def test_an_upload_outliving_its_prepared_ttl_is_uploaded_again_under_new_ids() -> None:
    node = Node()
    client = await node.open()
    stream = await client.streams.create_and_open_stream()
    for i in range(5):
        await stream.append(RecordBatch(bytes([i])))
    reached, release = asyncio.Event(), asyncio.Event()
    calls = 0

    class Hold(UploadObserver):
        async def before_commit(self) -> None:
            nonlocal calls
            calls += 1
            if calls == 1:
                reached.set()
                await release.wait()

    client.engine.upload_observer = Hold()
    upload = asyncio.create_task(client.engine.force_upload(None))
    await reached.wait()
    expired = await node.metadata.expire_prepared(now_ms=1 << 60)  # the TTL passed meanwhile
    assert expired
    release.set()
    await upload
    assert calls == 2
    client.engine.cache.try_real_free(target_bytes=0)
    assert [b.payload for b in await stream.fetch(0, 5)] == [bytes([i]) for i in range(5)]
    committed = await node.metadata.list_objects([ObjectState.COMMITTED])
    assert {o.object_id for o in committed}.isdisjoint(expired)
    await client.close()


async def test_upload_busy_time_is_complete_when_force_upload_returns() -> None:
    """The upload rate (uploaded bytes / busy time) is read right after a forced upload: the busy
    time must already include that upload (it ended at the commit, not at the clean-up after it)."""
    ticks = iter(range(1_000_000))

    def clock() -> float:
        return float(next(ticks))  # one second later at every look

    client = await Node(clock=clock).open()
    engine = client.engine
    # enough streams that the clean-up after the commit (freezing the block) takes several turns
    streams = [await client.streams.create_and_open_stream() for _ in range(12 * FROZEN_STREAMS_PER_TURN)]
    for stream in streams:
        await stream.append(RecordBatch(b"x" * 100))
    await engine.force_upload(None)
    busy_s = engine.stats.upload_busy_s
    assert engine.stats.uploads >= 1
    assert busy_s >= 1.0
    for _ in range(100):  # the clean-up after the commit finishes meanwhile: it adds no busy time
        await asyncio.sleep(0)
    assert engine.stats.upload_busy_s == busy_s
    await client.close()
