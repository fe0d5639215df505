"""Plain appends of one event-loop turn share one WAL record (:mod:`s3stream.engine.coalesce`), on the
real block WAL file and SQLite metadata of an embedded engine.

A "crash image" is a copy of the open engine's data dir taken while nothing is being written: what a
kill -9 at that moment leaves on disk (every acknowledged append is durable in the WAL file; the
SQLite files are copied with their journal)."""

from __future__ import annotations

import asyncio
import contextlib
import random
import shutil
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest

from s3stream.assembly import WAL_FILE, open_block_wal, open_client
from s3stream.config import Config
from s3stream.engine.append import AppendPath
from s3stream.engine.client import Client
from s3stream.engine.core import Engine
from s3stream.engine.heartbeat import Heartbeat
from s3stream.engine.walbody import decode_body
from s3stream.engine.walport import BodyParts
from s3stream.errors import FencedError, UnavailableError
from s3stream.ids import NodeId
from s3stream.metadata.memory import MemoryMetadataStore
from s3stream.model import RecordBatch
from s3stream.storage.memory import MemoryObjectStorage
from tests.unit.test_engine import SMALL
from tests.unit.test_engine_lease_acks import LEASE_MS, Clock, assert_node_fenced
from wal.errors import WalCapacityError

HELD = Config(
    wal_upload_threshold_bytes=64 << 20,
    wal_upload_interval_ms=86_400_000,
)
"""Nothing is uploaded while a test runs: every acknowledged batch is only in the WAL."""


def _appends(client: Client) -> AppendPath:
    path = client.engine._appends
    assert isinstance(path, AppendPath)
    assert path.coalescer is not None  # the block WAL submits in call order: coalescing is on
    return path


def _crash_image(data_dir: Path, into: Path) -> Path:
    shutil.copytree(data_dir, into)
    return into


async def _wal_bodies(data_dir: Path, config: Config = HELD) -> list[tuple[int, bytes]]:
    wal = await open_block_wal(data_dir / WAL_FILE, config, node_epoch=1 << 30)
    try:
        return [(offset, bytes(body)) for offset, body in await wal.recover()]
    finally:
        await wal.close()


async def test_appends_of_one_turn_are_one_wal_record_and_a_crash_image_recovers_them(tmp_path: Path) -> None:
    client = await open_client(tmp_path / "node", config=HELD)
    streams = [await client.streams.create_and_open_stream() for _ in range(10)]
    path = _appends(client)
    before = path.coalescer.record_count if path.coalescer else 0
    bases = await asyncio.gather(*(streams[n % 10].append(RecordBatch(b"%d" % n)) for n in range(300)))
    assert bases == [n // 10 for n in range(300)]  # each stream's offsets in submission order
    assert path.coalescer is not None
    assert path.coalescer.record_count - before == 1  # one turn: one WAL record for all 300
    assert [s.confirm_offset for s in streams] == [30] * 10
    image = _crash_image(tmp_path / "node", tmp_path / "image")
    await client.close()

    bodies = await _wal_bodies(_crash_image(image, tmp_path / "image-wal"))
    batches = [b for _, body in bodies for b in decode_body(body).batches]
    assert len(batches) == 300
    recovered = await open_client(image, config=HELD)
    try:
        for i, stream_id in enumerate(s.stream_id for s in streams):
            stream = await recovered.streams.open_stream(stream_id, epoch=1)
            got = await stream.fetch(0, 30)
            assert [(b.base_offset, b.payload) for b in got] == [(k, b"%d" % (k * 10 + i)) for k in range(30)]
    finally:
        await recovered.close()


async def test_a_record_written_after_coalesced_appends_of_the_same_turn_lands_after_them(
    tmp_path: Path,
) -> None:
    """An atomic group submitted in the same turn as plain appends takes a later sequence number:
    the open coalesced record goes to the WAL first, so WAL order is submission order."""
    client = await open_client(tmp_path / "node", config=HELD)
    a, b = [await client.streams.create_and_open_stream() for _ in range(2)]
    plain = [asyncio.ensure_future(a.append(RecordBatch(b"p%d" % n))) for n in range(5)]
    await asyncio.sleep(0)  # the plain appends ran up to their WAL wait: the record is open
    # Awaited right here: the group reaches its WAL write in this step, before the turn ends.
    assert await client.append_atomic([(a, RecordBatch(b"g")), (b, RecordBatch(b"h"))]) == [5, 0]
    assert await asyncio.gather(*plain) == [0, 1, 2, 3, 4]
    image = _crash_image(tmp_path / "node", tmp_path / "image")
    await client.close()
    bodies = await _wal_bodies(image)
    decoded = [[(x.stream_id, x.base_offset) for x in decode_body(body).batches] for _, body in bodies]
    assert decoded == [[(a.stream_id, n) for n in range(5)], [(a.stream_id, 5), (b.stream_id, 0)]]


async def test_cancelling_one_appender_leaves_the_others_of_its_record_acknowledged(tmp_path: Path) -> None:
    client = await open_client(tmp_path / "node", config=HELD)
    streams = [await client.streams.create_and_open_stream() for _ in range(3)]
    tasks = [asyncio.ensure_future(s.append(RecordBatch(b"x"))) for s in streams]
    await asyncio.sleep(0)  # every append waits for the shared write now
    tasks[1].cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert results[0] == 0
    assert results[2] == 0
    assert isinstance(results[1], asyncio.CancelledError)
    assert streams[0].confirm_offset == 1 == streams[2].confirm_offset
    with pytest.raises(FencedError):  # a cancelled append fences its stream, as without coalescing
        await streams[1].append(RecordBatch(b"y"))
    assert await streams[0].append(RecordBatch(b"z")) == 1
    await client.close()


async def test_a_failed_coalesced_write_fails_and_fences_every_append_of_it(tmp_path: Path) -> None:
    client = await open_client(tmp_path / "node", config=HELD)
    streams = [await client.streams.create_and_open_stream() for _ in range(4)]
    coalescer = _appends(client).coalescer
    assert coalescer is not None
    loop = asyncio.get_running_loop()

    def failing(_: object) -> asyncio.Future[int]:
        future: asyncio.Future[int] = loop.create_future()
        loop.call_soon(future.set_exception, OSError(5, "injected EIO"))
        return future

    coalescer._wal_append = failing
    results = await asyncio.gather(*(s.append(RecordBatch(b"x")) for s in streams), return_exceptions=True)
    assert all(isinstance(r, UnavailableError) for r in results), results
    assert all(s.confirm_offset == 0 for s in streams)
    for stream in streams:
        with pytest.raises(FencedError):
            await stream.append(RecordBatch(b"y"))
    await client.close()


async def _leased(tmp_path: Path) -> tuple[Client, Engine, Clock]:
    """An engine on a block WAL in ``tmp_path`` whose lease is a real Heartbeat on ``clock`` (never
    renewed here: its deadline is fixed)."""
    metadata = MemoryMetadataStore()
    info = await metadata.open_node(node_id=NodeId(1), lease_ms=LEASE_MS)
    clock = Clock()
    heartbeat = Heartbeat(metadata, node_id=NodeId(1), node_epoch=info.node_epoch, lease_ms=LEASE_MS,
                          opened_at_s=clock(), clock=clock)  # fmt: skip
    wal = await open_block_wal(tmp_path / WAL_FILE, SMALL, node_epoch=info.node_epoch)
    engine = Engine(SMALL, wal=wal, metadata=metadata, storage=MemoryObjectStorage(), node_id=NodeId(1),
                    node_epoch=info.node_epoch, lease_check=heartbeat.holds_lease)  # fmt: skip
    heartbeat.add_listener(engine.fence)
    await engine.start()
    return Client(engine, metadata, closers=[wal.close]), engine, clock


async def test_a_coalesced_record_durable_after_the_lease_deadline_acknowledges_none_of_its_appends(
    tmp_path: Path,
) -> None:
    client, engine, clock = await _leased(tmp_path)
    streams = [await client.streams.create_and_open_stream() for _ in range(3)]
    coalescer = _appends(client).coalescer
    assert coalescer is not None
    loop = asyncio.get_running_loop()
    gate: asyncio.Future[None] = loop.create_future()
    real_append = coalescer._wal_append

    def held(body: BodyParts) -> asyncio.Future[int]:
        """The real write, answered once ``gate`` is set (the process paused while it was in flight)."""
        written = asyncio.ensure_future(real_append(body))
        answer: asyncio.Future[int] = loop.create_future()
        gate.add_done_callback(lambda _: written.add_done_callback(lambda w: answer.set_result(w.result())))
        return answer

    coalescer._wal_append = held
    pending = [asyncio.ensure_future(s.append(RecordBatch(b"late"))) for s in streams]
    await asyncio.sleep(0.05)  # the record is written and durable; its answer waits for the gate
    clock.s += LEASE_MS / 1000
    gate.set_result(None)
    results = await asyncio.gather(*pending, return_exceptions=True)
    for result in results:
        assert_node_fenced(result)  # type: ignore[arg-type]
    assert [s.confirm_offset for s in streams] == [0, 0, 0]
    assert engine.fenced
    with contextlib.suppress(FencedError):
        await client.close()


async def test_appends_joining_an_open_record_after_the_lease_deadline_never_reach_the_wal(
    tmp_path: Path,
) -> None:
    client, engine, clock = await _leased(tmp_path)
    streams = [await client.streams.create_and_open_stream() for _ in range(3)]
    coalescer = _appends(client).coalescer
    assert coalescer is not None
    written = coalescer.record_count
    first = asyncio.ensure_future(streams[0].append(RecordBatch(b"a")))
    await asyncio.sleep(0)  # the first append opened a record (checked: the lease held)
    assert coalescer.open_seq >= 0
    clock.s += LEASE_MS / 1000
    joining = [asyncio.ensure_future(s.append(RecordBatch(b"b"))) for s in streams[1:]]
    results = await asyncio.gather(first, *joining, return_exceptions=True)
    for result in results:
        assert_node_fenced(result)  # type: ignore[arg-type]
    assert coalescer.record_count == written  # the record was refused before the WAL
    assert [s.confirm_offset for s in streams] == [0, 0, 0]
    assert engine.fenced
    with contextlib.suppress(FencedError):
        await client.close()
    assert await _wal_bodies(tmp_path, SMALL) == []  # nothing was appended to the WAL


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_a_concurrent_mix_of_plain_group_and_kv_appends_recovers_from_a_crash_image(
    tmp_path: Path, seed: int
) -> None:
    """Plain appends small and large (coalesced or not), atomic groups and KV puts, submitted
    concurrently in the same turns: a crash image recovers every acknowledged batch of every stream,
    in offset order, and the last KV value."""
    rng = random.Random(seed)
    client = await open_client(tmp_path / "node", config=HELD)
    streams = [await client.streams.create_and_open_stream() for _ in range(5)]
    expected: dict[int, dict[int, bytes]] = {s.stream_id: {} for s in streams}

    async def plain(stream_index: int, payload: bytes) -> None:
        stream = streams[stream_index]
        expected[stream.stream_id][await stream.append(RecordBatch(payload))] = payload

    async def group(entries: list[tuple[int, bytes]], value: bytes) -> None:
        bases = await client.append_atomic(
            [(streams[i], RecordBatch(p)) for i, p in entries], kv={"key": value}
        )
        for (i, payload), base in zip(entries, bases, strict=True):
            expected[streams[i].stream_id][base] = payload

    last_value = b""
    for turn in range(6):
        calls: list[Coroutine[Any, Any, None]] = []
        for n in range(rng.randint(20, 60)):
            kind = rng.random()
            payload = b"%d-%d-" % (turn, n) * rng.choice([1, 10, 3000])  # 3000 x: above PARTS_MIN_BYTES
            if kind < 0.85:
                calls.append(plain(rng.randrange(5), payload))
            elif kind < 0.95:
                entries = [(rng.randrange(5), payload) for _ in range(rng.randint(1, 3))]
                last_value = b"v%d-%d" % (turn, n)
                calls.append(group(entries, last_value))
            else:
                last_value = b"kv%d-%d" % (turn, n)
                calls.append(_put(client, last_value))
        await asyncio.gather(*calls)
    image = _crash_image(tmp_path / "node", tmp_path / "image")
    await client.close()

    recovered = await open_client(image, config=HELD)
    try:
        assert await recovered.kv.get("key") == last_value
        for stream in streams:
            reopened = await recovered.streams.open_stream(stream.stream_id, epoch=1)
            want = expected[stream.stream_id]
            got = await reopened.fetch(0, len(want), max_bytes=64 << 20)
            assert [(b.base_offset, b.payload) for b in got] == sorted(want.items())
    finally:
        await recovered.close()


async def _put(client: Client, value: bytes) -> None:
    await client.kv.put("key", value)


async def test_appends_of_one_record_waiting_behind_a_retried_write_are_released_in_order(
    tmp_path: Path,
) -> None:
    """The first append's record finds the WAL full and is written again alone (later); two later
    appends of the same stream share the next record, durable first, and both wait for their turn
    under that record's one sequence number: the trim tracker holds the record for both."""
    client = await open_client(tmp_path / "node", config=HELD)
    stream = await client.streams.create_and_open_stream()
    coalescer = _appends(client).coalescer
    assert coalescer is not None
    loop = asyncio.get_running_loop()
    real_append = coalescer._wal_append
    calls = 0

    def full_once(body: BodyParts) -> asyncio.Future[int]:
        nonlocal calls
        calls += 1
        if calls > 1:
            return asyncio.ensure_future(real_append(body))
        future: asyncio.Future[int] = loop.create_future()
        future.set_exception(WalCapacityError("injected: WAL full"))
        return future

    coalescer._wal_append = full_once
    first = asyncio.ensure_future(stream.append(RecordBatch(b"a")))
    await asyncio.sleep(0.02)  # its record was refused: it waits to write again alone
    assert not first.done()
    later = [asyncio.ensure_future(stream.append(RecordBatch(p))) for p in (b"b", b"c")]
    assert await asyncio.gather(first, *later) == [0, 1, 2]
    tracker = client.engine._trim_tracker
    assert not tracker._held  # every held append was released
    got = await stream.fetch(0, 3)
    assert [(b.base_offset, b.payload) for b in got] == [(0, b"a"), (1, b"b"), (2, b"c")]
    await client.close()
