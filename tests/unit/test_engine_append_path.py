"""The plain append's fast path: acknowledged in offset order whatever order the WAL completes in,
the public value types' checks, ``Stream.append`` behaving as a coroutine function, the watchdog."""

from __future__ import annotations

import asyncio
import dataclasses
import pickle
from pathlib import Path

import pytest

import wal.errors as walerr
from s3stream.assembly import open_block_wal
from s3stream.engine.client import Client, Stream
from s3stream.engine.core import Engine
from s3stream.engine.walport import BodyParts, MemoryWal, fast_append
from s3stream.errors import CapacityError, ClosedError, FencedError, InvalidArgumentError, UnavailableError
from s3stream.ids import NodeId
from s3stream.metadata.memory import MemoryMetadataStore
from s3stream.model import RecordBatch
from s3stream.storage.memory import MemoryObjectStorage
from tests.support.wal import FaultyMemoryWal
from tests.unit.test_engine import SMALL, Node


class ReorderingWal(MemoryWal):
    """A MemoryWal whose appends complete only when the test releases them, in any order it likes."""

    def __init__(self) -> None:
        super().__init__(capacity_bytes=SMALL.wal_capacity_bytes)
        self.held: list[asyncio.Future[None]] = []
        self.hold = False

    async def append(self, body: BodyParts) -> int:
        offset = await super().append(body)
        if self.hold:
            release: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self.held.append(release)
            await release
        return offset

    async def wait_held(self, count: int) -> None:
        while len(self.held) < count:
            await asyncio.sleep(0)

    async def held_appends(self, stream: Stream, *payloads: bytes) -> list[asyncio.Task[int]]:
        """Appends of ``payloads`` to ``stream``, each written but held until the test releases it."""
        self.hold = True
        tasks = [asyncio.create_task(stream.append(RecordBatch(p))) for p in payloads]
        await self.wait_held(len(self.held) + len(payloads))
        return tasks


async def test_appends_the_wal_completes_in_reverse_are_acknowledged_in_offset_order() -> None:
    wal = ReorderingWal()
    client = await Node(wal=wal).open()
    stream = await client.streams.create_and_open_stream()
    other = await client.streams.create_and_open_stream()
    wal.hold = True
    acked: list[tuple[int, int]] = []

    async def one(target: Stream, i: int) -> None:
        base = await target.append(RecordBatch(bytes([i])))
        acked.append((target.stream_id, base))

    tasks = [asyncio.create_task(one(stream if i % 3 else other, i)) for i in range(12)]
    await wal.wait_held(12)
    for release in reversed(wal.held):  # the newest write completes first
        release.set_result(None)
        await asyncio.sleep(0)
    await asyncio.gather(*tasks)
    mine = [base for sid, base in acked if sid == stream.stream_id]
    theirs = [base for sid, base in acked if sid == other.stream_id]
    assert mine == list(range(8))
    assert theirs == list(range(4))
    assert (stream.confirm_offset, other.confirm_offset) == (8, 4)
    fetched = await stream.fetch(0, 8)
    assert [(b.base_offset, b.payload) for b in fetched] == [
        (n, bytes([i])) for n, i in enumerate(i for i in range(12) if i % 3)
    ]
    await client.close()


async def test_an_append_completing_before_an_earlier_one_waits_for_it() -> None:
    wal = ReorderingWal()
    client = await Node(wal=wal).open()
    stream = await client.streams.create_and_open_stream()
    first, second = await wal.held_appends(stream, b"a", b"b")
    wal.held[1].set_result(None)
    await asyncio.sleep(0.01)
    assert not second.done()  # durable, but its predecessor is not
    assert stream.confirm_offset == 0
    wal.held[0].set_result(None)
    assert await first == 0
    assert await second == 1
    assert stream.confirm_offset == 2
    await client.close()


async def test_a_failed_append_fails_the_later_ones_of_its_stream_even_when_they_are_durable() -> None:
    wal = ReorderingWal()
    client = await Node(wal=wal).open()
    stream = await client.streams.create_and_open_stream()
    first, second = await wal.held_appends(stream, b"a", b"b")
    wal.held[1].set_result(None)
    await asyncio.sleep(0)
    wal.held[0].set_exception(UnavailableError("disk gone"))
    with pytest.raises(UnavailableError):
        await first
    with pytest.raises(FencedError):
        await second
    assert stream.confirm_offset == 0
    await client.close()


async def test_stream_append_behaves_as_a_coroutine_function() -> None:
    client = await Node().open()
    stream = await client.streams.create_and_open_stream()
    pending = stream.append(RecordBatch(b"x"))
    assert asyncio.iscoroutine(pending)
    assert await pending == 0
    bad = stream.append(RecordBatch(b""))  # no error before the await, as from an ``async def``
    with pytest.raises(InvalidArgumentError):
        await bad
    not_a_batch = stream.append(b"raw")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        await not_a_batch
    await client.close()
    closed = stream.append(RecordBatch(b"late"))
    with pytest.raises(ClosedError):
        await closed


async def test_a_mutable_payload_is_copied_when_appended() -> None:
    client = await Node().open()
    stream = await client.streams.create_and_open_stream()
    buffer = bytearray(b"abc")
    pending = stream.append(RecordBatch(buffer))
    buffer[:] = b"xyz"  # the caller reuses its buffer once append() was called
    await pending
    buffer[:] = b"123"
    assert [b.payload for b in await stream.fetch(0, 1)] == [b"abc"]
    await client.close()


class Size(int):
    pass


def test_record_batch_checks_its_fields_and_stays_a_frozen_value() -> None:
    batch = RecordBatch(b"ab", 2)
    assert batch == RecordBatch(b"ab", 2)
    assert hash(batch) == hash(RecordBatch(b"ab", 2))
    assert repr(batch) == "RecordBatch(payload=b'ab', count=2)"
    assert pickle.loads(pickle.dumps(batch)) == batch
    assert dataclasses.replace(batch, count=3).count == 3
    assert RecordBatch(b"a").count == 1
    assert RecordBatch(bytearray(b"a"), Size(5)).count == 5  # int subclasses are ints
    assert RecordBatch(memoryview(b"a"), (1 << 31) - 1).count == (1 << 31) - 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        batch.count = 5  # type: ignore[misc]
    for payload, count in [
        ("text", 1),
        (None, 1),
        (b"a", True),
        (b"a", 0),
        (b"a", -1),
        (b"a", 1.0),
        (b"a", 1 << 31),
    ]:
        with pytest.raises(InvalidArgumentError):
            RecordBatch(payload, count)  # type: ignore[arg-type]


async def test_watchdog_fails_only_an_append_in_flight_longer_than_the_timeout() -> None:
    now = [0.0]
    wal = FaultyMemoryWal(capacity_bytes=SMALL.wal_capacity_bytes)
    client = await Node(SMALL.replace(wal_append_timeout_ms=1000), wal=wal).open()
    appends = client.engine._appends
    appends.clock = lambda: now[0]
    stream = await client.streams.create_and_open_stream()
    wal.gate = asyncio.Event()
    stuck = asyncio.create_task(stream.append(RecordBatch(b"stuck")))
    await asyncio.sleep(0)
    appends.watchdog()  # first seen at 0
    now[0] = 1.0
    appends.watchdog()
    assert client.engine._supervisor.failed is None  # not longer than the timeout yet
    now[0] = 1.01
    appends.watchdog()
    with pytest.raises(ClosedError):
        await stuck
    with pytest.raises(UnavailableError, match="did not complete"):
        await stream.append(RecordBatch(b"after"))
    await client.close()


async def test_watchdog_times_each_oldest_append_afresh() -> None:
    now = [0.0]
    wal = ReorderingWal()
    client = await Node(SMALL.replace(wal_append_timeout_ms=1000), wal=wal).open()
    appends = client.engine._appends
    appends.clock = lambda: now[0]
    stream = await client.streams.create_and_open_stream()
    wal.hold = True
    first = asyncio.create_task(stream.append(RecordBatch(b"a")))
    await wal.wait_held(1)
    appends.watchdog()
    now[0] = 0.9
    second = asyncio.create_task(stream.append(RecordBatch(b"b")))
    await wal.wait_held(2)
    wal.held[0].set_result(None)
    assert await first == 0
    appends.watchdog()  # the second is now the oldest: timed from here
    now[0] = 1.8
    appends.watchdog()
    assert client.engine._supervisor.failed is None
    wal.held[1].set_result(None)
    assert await second == 1
    await client.close()


async def test_the_hot_path_awaits_the_block_wal_itself_and_translates_its_errors(tmp_path: Path) -> None:
    adapter = await open_block_wal(tmp_path / "wal", SMALL, node_epoch=1)
    append, translate = fast_append(adapter)
    assert append == adapter._wal.append  # no adapter frame per append
    assert translate is not None
    full = translate(walerr.WalCapacityError("full"))
    assert isinstance(full, CapacityError)
    assert isinstance(full.__cause__, walerr.WalCapacityError)
    assert isinstance(translate(OSError(5, "EIO")), UnavailableError)
    cancelled = asyncio.CancelledError()
    assert translate(cancelled) is cancelled
    assert fast_append(MemoryWal(capacity_bytes=1 << 20))[1] is None  # raises s3stream errors itself

    async def broken(body: BodyParts) -> int:
        raise walerr.WalIOError("device gone")

    adapter.append_untranslated = broken  # type: ignore[assignment]
    metadata, storage = MemoryMetadataStore(), MemoryObjectStorage()
    engine = Engine(SMALL, wal=adapter, metadata=metadata, storage=storage, node_id=NodeId(0), node_epoch=1)
    await engine.start()
    client = Client(engine, metadata, closers=[adapter.close])
    stream = await client.streams.create_and_open_stream()
    with pytest.raises(UnavailableError, match="device gone") as failed:
        await stream.append(RecordBatch(b"lost"))
    assert isinstance(failed.value.__cause__, walerr.WalIOError)
    with pytest.raises(FencedError):
        await stream.append(RecordBatch(b"after"))
    await client.close()
