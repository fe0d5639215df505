"""Compaction through the engine on in-memory twins: fetch results identical before and after every
compaction (also while appends and reads go on), trimmed and deleted data dropped, force split,
stream object merges on both the copy and the rewrite path, deletion after retention, orphans."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence

from compaction.compactor import Compactor
from compaction.gc import GarbageCollector
from s3stream.assembly import build_reader
from s3stream.config import Config
from s3stream.engine.client import Client, Stream
from s3stream.engine.core import Engine
from s3stream.engine.walport import MemoryWal
from s3stream.ids import NodeId, ObjectId
from s3stream.metadata.base import ObjectKind, ObjectState, S3ObjectMetadata
from s3stream.metadata.memory import MemoryMetadataStore
from s3stream.model import RecordBatch
from s3stream.objectformat import object_key
from s3stream.storage.memory import MemoryObjectStorage

KiB = 1024
MiB = 1024 * KiB

CONFIG = Config(
    wal_capacity_bytes=16 * MiB,
    wal_record_max_bytes=1 * MiB,
    record_max_bytes=256 * KiB,
    wal_cache_size_bytes=8 * MiB,
    wal_upload_threshold_bytes=4 * MiB,
    wal_upload_interval_ms=3_600_000,
    upload_retry_backoff_ms=5,
    upload_retry_backoff_max_ms=20,
    stream_object_split_size_bytes=1 << 40,
    object_block_size_bytes=4 * KiB,
    object_delete_retention_minutes=0,
    stream_set_object_compaction_cache_size_bytes=1 * MiB,
    stream_set_object_compaction_stream_split_size_bytes=64 * KiB,
)


class Env:
    def __init__(self, config: Config = CONFIG) -> None:
        self.config = config
        self.metadata = MemoryMetadataStore()
        self.storage = MemoryObjectStorage()
        self.wal = MemoryWal(capacity_bytes=config.wal_capacity_bytes)
        self.client: Client | None = None

    async def open(self) -> Client:
        engine = Engine(
            self.config,
            wal=self.wal.reopen(),
            metadata=self.metadata,
            storage=self.storage,
            node_id=NodeId(0),
            node_epoch=1,
            reader=build_reader(self.config, self.metadata, self.storage),
        )
        await engine.start()
        self.client = Client(engine, self.metadata, closers=[self.wal.close])
        return self.client

    def compactor(self, **kwargs: object) -> Compactor:
        return Compactor(self.config, self.metadata, self.storage, node_id=NodeId(0), node_epoch=1, **kwargs)  # type: ignore[arg-type]

    async def keys(self) -> set[str]:
        return {info.key async for info in self.storage.list("")}

    async def committed_keys(self) -> set[str]:
        objs = await self.metadata.list_objects([ObjectState.COMMITTED])
        return {object_key(o.object_id, self.config.namespace) for o in objs}


def payload(stream: int, offset: int, size: int) -> bytes:
    head = f"{stream}:{offset}:".encode()
    return (head * (size // len(head) + 1))[:size]


async def fill(client: Client, streams: list[Stream], rounds: int, rng: random.Random) -> None:
    """Append a few batches per stream per round and upload after every round (one object each)."""
    for _ in range(rounds):
        for s in streams:
            for _ in range(rng.randint(1, 4)):
                offset = s.next_offset
                await s.append(
                    RecordBatch(payload(s.stream_id, offset, rng.randint(100, 3000)), count=rng.randint(1, 3))
                )
        await client.engine.force_upload(None)


async def snapshot(streams: list[Stream]) -> dict[int, list[tuple[int, int, bytes]]]:
    out: dict[int, list[tuple[int, int, bytes]]] = {}
    for s in streams:
        batches, offset = [], s.start_offset
        while offset < s.confirm_offset:
            got = await s.fetch(offset, s.confirm_offset, max_bytes=1 << 20)
            batches += [(b.base_offset, b.count, b.payload) for b in got]
            offset = got[-1].end_offset
        out[s.stream_id] = batches
    return out


async def test_stream_set_compaction_keeps_fetch_results_and_shrinks_object_count() -> None:
    env = Env()
    client = await env.open()
    streams = [await client.streams.create_and_open_stream() for _ in range(5)]
    await fill(client, streams, 12, random.Random(1))
    before = await snapshot(streams)
    ssos_before = await env.metadata.get_stream_set_objects(NodeId(0))
    assert len(ssos_before) == 12
    report = await env.compactor().run_once()
    assert report.problems == ()
    assert report.stream_set_objects_compacted == 12
    assert report.commit_count == 1
    ssos = await env.metadata.get_stream_set_objects(NodeId(0))
    assert len(ssos) <= 1
    assert ssos[0].order_id == min(o.order_id for o in ssos_before)
    assert await snapshot(streams) == before
    assert report.gc.deleted_count == 12  # retention 0: the compacted objects are gone
    assert await env.keys() == await env.committed_keys()
    await client.close()


async def test_fetch_results_stay_identical_while_appends_reads_and_compactions_interleave() -> None:
    env = Env(CONFIG.replace(object_delete_retention_minutes=10))  # reads in flight keep their objects
    client = await env.open()
    rng = random.Random(7)
    streams = [await client.streams.create_and_open_stream() for _ in range(4)]
    compactor = env.compactor()
    expected: dict[int, list[tuple[int, int, bytes]]] = {s.stream_id: [] for s in streams}
    stop = asyncio.Event()

    async def producer() -> None:
        while not stop.is_set():
            s = rng.choice(streams)
            offset = s.next_offset
            data = payload(s.stream_id, offset, rng.randint(50, 2000))
            count = rng.randint(1, 3)
            await s.append(RecordBatch(data, count=count))
            expected[s.stream_id].append((offset, count, data))
            if rng.random() < 0.05:
                await client.engine.force_upload(None)
            await asyncio.sleep(0)

    async def reader() -> None:
        while not stop.is_set():
            s = rng.choice(streams)
            want = list(expected[s.stream_id])
            if want:
                start = rng.choice(want)[0]
                end = want[-1][0] + want[-1][1]
                got = await s.fetch(start, end, max_bytes=1 << 20)
                assert [(b.base_offset, b.count, b.payload) for b in got] == [
                    w for w in want if w[0] >= start
                ][: len(got)]
            await asyncio.sleep(0)

    tasks = [asyncio.create_task(producer()), asyncio.create_task(reader())]
    compacted = 0
    for _ in range(8):
        await asyncio.sleep(0.05)
        report = await compactor.run_once(stream_objects=True)
        assert report.problems == ()
        compacted += report.stream_set_objects_compacted
        confirmed = {
            s.stream_id: [w for w in expected[s.stream_id] if w[0] < s.confirm_offset] for s in streams
        }
        assert await snapshot(streams) == confirmed
    stop.set()
    await asyncio.gather(*tasks)
    assert compacted > 0
    await client.engine.force_upload(None)
    await compactor.run_once(stream_objects=True)
    assert await snapshot(streams) == expected
    gc = GarbageCollector(
        env.metadata, env.storage, namespace=env.config.namespace, retention_ms=0, orphan_ttl_ms=0
    )
    assert (await gc.collect(scan_orphans=True)).orphan_deleted_count == 0
    assert await env.keys() == await env.committed_keys()
    assert await snapshot(streams) == expected
    await client.close()


async def test_trimmed_and_deleted_stream_data_is_dropped_by_compaction() -> None:
    env = Env()
    client = await env.open()
    streams = [await client.streams.create_and_open_stream() for _ in range(3)]
    await fill(client, streams, 6, random.Random(3))
    keep, trim, gone = streams
    await trim.trim(trim.confirm_offset)
    gone_id = gone.stream_id
    await gone.destroy()
    before = await snapshot([keep])
    report = await env.compactor().run_once()
    assert report.problems == ()
    ssos = await env.metadata.get_stream_set_objects(NodeId(0))
    held = {r.stream_id for sso in ssos for r in sso.ranges}
    assert held <= {keep.stream_id}
    assert gone_id not in held
    assert await snapshot([keep]) == before
    await client.close()


async def test_old_objects_are_force_split_into_stream_objects() -> None:
    env = Env()
    client = await env.open()
    streams = [await client.streams.create_and_open_stream() for _ in range(3)]
    await fill(client, streams, 3, random.Random(5))
    before = await snapshot(streams)
    later = int(time.time() * 1000) + 3 * 3600_000
    report = await env.compactor(clock_ms=lambda: later).run_once()
    assert report.force_split_count == 3
    assert report.stream_objects_written == 9  # one per stream per object
    assert await env.metadata.get_stream_set_objects(NodeId(0)) == []
    assert await snapshot(streams) == before
    # then the stream object pass merges each stream's three contiguous stream objects into one
    report = await env.compactor().run_once(stream_objects=True)
    assert report.stream_objects_merged == 9
    assert report.stream_objects_written == 3
    assert await snapshot(streams) == before
    assert await env.keys() == await env.committed_keys()
    await client.close()


async def _stream_objects_env(copy_min: int) -> tuple[Env, Client, list[Stream], Compactor]:
    env = Env(CONFIG.replace(stream_object_split_size_bytes=1))  # every upload: one stream object per stream
    client = await env.open()
    streams = [await client.streams.create_and_open_stream() for _ in range(2)]
    await fill(client, streams, 5, random.Random(9))
    compactor = env.compactor()
    compactor.stream_objects.copy_size_min_bytes = copy_min
    return env, client, streams, compactor


async def test_stream_objects_merge_by_server_side_copy_with_a_rebuilt_index() -> None:
    env, client, streams, compactor = await _stream_objects_env(copy_min=1)
    before = await snapshot(streams)
    env.storage.stats.reset()
    report = await compactor.run_once(stream_objects=True)
    assert report.stream_objects_merged == 10
    assert report.stream_objects_written == 2
    assert report.bytes_copied > 0
    assert env.storage.stats.counts["copy"] == 10
    assert env.storage.stats.counts["get"] == 10  # one tail read per source, no block reads
    for s in streams:
        objs = await env.metadata.get_stream_objects(
            stream_id=s.stream_id, start_offset=0, end_offset=-1, limit=100
        )
        assert [(o.start_offset, o.end_offset) for o in objs] == [(0, s.confirm_offset)]
    assert await snapshot(streams) == before
    await client.close()


async def test_stream_objects_merge_by_rewrite_below_the_copy_threshold_and_trimmed_ones_expire() -> None:
    env, client, streams, compactor = await _stream_objects_env(copy_min=1 << 30)
    s0 = streams[0]
    objs = await env.metadata.get_stream_objects(
        stream_id=s0.stream_id, start_offset=0, end_offset=-1, limit=100
    )
    await s0.trim(objs[2].end_offset)  # the first three objects of stream 0 are wholly trimmed
    before = await snapshot(streams)
    report = await compactor.run_once(stream_objects=True)
    assert report.stream_objects_expired == 3
    assert report.bytes_copied == 0
    assert env.storage.stats.counts["copy"] == 0
    assert report.stream_objects_written == 2
    assert await snapshot(streams) == before
    assert await env.keys() == await env.committed_keys()
    await client.close()


async def test_gc_waits_for_the_retention_and_removes_old_orphans_only() -> None:
    env = Env(CONFIG.replace(object_delete_retention_minutes=10))
    client = await env.open()
    streams = [await client.streams.create_and_open_stream() for _ in range(2)]
    await fill(client, streams, 3, random.Random(11))
    report = await env.compactor().run_once()
    assert report.stream_set_objects_compacted == 3
    assert report.gc.deleted_count == 0  # within the retention: reads in flight may still need them
    marked = await env.metadata.list_objects([ObjectState.MARK_DESTROYED])
    assert len(marked) == 3
    # An object written under an id metadata issued and then forgot (a crashed writer's), and one
    # under an id this metadata never issued (at or above the next object id): only the first is an orphan.
    forgotten = await env.metadata.prepare_objects(count=2, ttl_ms=3_600_000)
    await env.metadata.mark_destroyed([forgotten], now_ms=int(time.time() * 1000))
    await env.metadata.remove_objects([forgotten])
    await env.storage.put(object_key(forgotten, env.config.namespace), b"orphan")
    await env.storage.put(object_key(999_999, env.config.namespace), b"never issued: left alone")
    await env.storage.put("not-an-object-key", b"left alone")
    await env.storage.put(object_key(888_888, "other-namespace"), b"left alone")
    now = int(time.time() * 1000)
    gc = GarbageCollector(env.metadata, env.storage, namespace=env.config.namespace, retention_ms=600_000,
                          orphan_ttl_ms=3_600_000, clock_ms=lambda: now)  # fmt: skip
    assert (await gc.collect(scan_orphans=True)).orphan_deleted_count == 0  # too young
    later = now + 2 * 3_600_000
    gc.clock_ms = lambda: later
    result = await gc.collect(scan_orphans=True)
    assert result.deleted_count == 3
    assert result.orphan_deleted_count == 1
    assert await env.keys() == await env.committed_keys() | {
        "not-an-object-key",
        object_key(888_888, "other-namespace"),
        object_key(999_999, env.config.namespace),
    }
    # the second prepared id expired at `later`: marked, waiting for its retention
    assert [o.object_id for o in await env.metadata.list_objects([ObjectState.MARK_DESTROYED])] == [
        forgotten + 1
    ]
    kinds = {o.kind for o in await env.metadata.list_objects([ObjectState.COMMITTED])}
    assert kinds == {ObjectKind.STREAM_SET}
    await client.close()


async def test_compactor_runs_in_the_background_and_close_stops_it() -> None:
    env = Env()
    client = await env.open()
    streams = [await client.streams.create_and_open_stream() for _ in range(2)]
    await fill(client, streams, 4, random.Random(13))
    compactor = env.compactor()
    compactor.interval_s = 0.01
    compactor.start()
    for _ in range(200):
        await asyncio.sleep(0.01)
        if compactor.last_report is not None:
            break
    await compactor.close()
    assert compactor.last_report is not None
    assert compactor.last_report.stream_set_objects_compacted == 4
    assert "StreamSet objects compacted" in compactor.last_report.summary()
    await client.close()


async def test_gc_deletes_in_batches_of_at_most_1000_keys() -> None:
    metadata = MemoryMetadataStore()
    storage = MemoryObjectStorage()
    first = await metadata.prepare_objects(count=2500, ttl_ms=1)
    for i in range(first, first + 2500, 7):
        await storage.put(object_key(i, CONFIG.namespace), b"x")
    later = int(time.time() * 1000) + 10_000
    gc = GarbageCollector(metadata, storage, namespace=CONFIG.namespace, retention_ms=0, orphan_ttl_ms=0,
                          clock_ms=lambda: later)  # fmt: skip
    report = await gc.collect()
    assert report.prepared_expired_count == 2500
    assert report.deleted_count == 2500
    assert report.delete_request_count == 3
    assert storage.stats.counts["delete"] == 3
    assert await metadata.list_objects() == []
    assert [info async for info in storage.list("")] == []


async def test_an_orphan_above_every_known_id_is_deleted_at_once() -> None:
    """The highest id ever issued, forgotten by metadata, is below the counter: an orphan, though no
    known id is above it."""
    metadata = MemoryMetadataStore()
    storage = MemoryObjectStorage()
    kept = await metadata.prepare_objects(count=2, ttl_ms=3_600_000)
    forgotten = ObjectId(kept + 1)
    await metadata.mark_destroyed([forgotten], now_ms=int(time.time() * 1000))
    await metadata.remove_objects([forgotten])
    await storage.put(object_key(kept, CONFIG.namespace), b"known: kept")
    await storage.put(object_key(forgotten, CONFIG.namespace), b"orphan")
    await storage.put(object_key(forgotten + 1, CONFIG.namespace), b"never issued: kept")
    later = int(time.time() * 1000) + 10_000
    gc = GarbageCollector(metadata, storage, namespace=CONFIG.namespace, retention_ms=3_600_000,
                          orphan_ttl_ms=0, clock_ms=lambda: later)  # fmt: skip
    assert (await gc.collect(scan_orphans=True)).orphan_deleted_count == 1
    assert [info.key async for info in storage.list("")] == [
        object_key(kept, CONFIG.namespace),
        object_key(forgotten + 1, CONFIG.namespace),
    ]


class _PreparesAfterItsRowsAreRead(MemoryMetadataStore):
    """Another node prepares an object just after the orphan scan read the object rows."""

    async def list_objects(self, states: Sequence[ObjectState] | None = None) -> list[S3ObjectMetadata]:
        rows = await super().list_objects(states)
        await self.prepare_objects(count=1, ttl_ms=3_600_000)
        return rows


async def test_an_id_issued_while_the_scan_reads_metadata_is_not_an_orphan() -> None:
    """A listed key under the id metadata hands out next (a key left by another cluster): the node
    that gets the id writes its object to that key, so the scan must keep it."""
    metadata = _PreparesAfterItsRowsAreRead()
    storage = MemoryObjectStorage()
    next_id = await metadata.next_object_id()
    await storage.put(object_key(next_id, CONFIG.namespace), b"about to be overwritten by its new owner")
    later = int(time.time() * 1000) + 10_000
    gc = GarbageCollector(metadata, storage, namespace=CONFIG.namespace, retention_ms=3_600_000,
                          orphan_ttl_ms=0, clock_ms=lambda: later)  # fmt: skip
    assert (await gc.collect(scan_orphans=True)).orphan_deleted_count == 0
    assert (await metadata.get_object(next_id)).state == ObjectState.PREPARED
    assert [info.key async for info in storage.list("")] == [object_key(next_id, CONFIG.namespace)]


async def test_a_corrupted_source_block_stops_the_commit_and_is_reported() -> None:
    env = Env()
    client = await env.open()
    streams = [await client.streams.create_and_open_stream() for _ in range(2)]
    await fill(client, streams, 3, random.Random(17))
    before = await snapshot(streams)
    victim = (await env.metadata.get_stream_set_objects(NodeId(0)))[1]
    key = object_key(victim.object_id, env.config.namespace)
    data = bytearray(await env.storage.get(key))
    data[40] ^= 0xFF  # inside the first data block
    await env.storage.put(key, bytes(data))
    report = await env.compactor().run_once()
    assert report.commit_count == 0
    assert any("CRC32C mismatch" in p for p in report.problems), report.problems
    assert len(await env.metadata.get_stream_set_objects(NodeId(0))) == 3  # nothing replaced
    data[40] ^= 0xFF
    await env.storage.put(key, bytes(data))
    assert await snapshot(streams) == before
    await client.close()
