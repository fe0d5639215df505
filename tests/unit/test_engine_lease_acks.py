"""Appends are acknowledged only under the node lease: refused before the WAL once the deadline passed, and
failed (never acknowledged) when their WAL write returns after it; the engine fences itself."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import pytest

from s3stream.engine.client import Client
from s3stream.engine.core import Engine
from s3stream.engine.heartbeat import Heartbeat
from s3stream.errors import ErrorCode, FencedError
from s3stream.ids import NodeId
from s3stream.metadata.memory import MemoryMetadataStore
from s3stream.model import RecordBatch
from s3stream.storage.memory import MemoryObjectStorage
from tests.unit.test_engine import SMALL
from tests.unit.test_engine_append_path import ReorderingWal

LEASE_MS = 1000


class Clock:
    def __init__(self) -> None:
        self.s = 1000.0

    def __call__(self) -> float:
        return self.s


async def leased_client(wal: ReorderingWal, clock: Clock) -> tuple[Client, Heartbeat]:
    """An engine whose lease is a real Heartbeat (never renewed here: its deadline is fixed)."""
    metadata = MemoryMetadataStore()
    info = await metadata.open_node(node_id=NodeId(1), lease_ms=LEASE_MS)
    heartbeat = Heartbeat(
        metadata,
        node_id=NodeId(1),
        node_epoch=info.node_epoch,
        lease_ms=LEASE_MS,
        opened_at_s=clock(),
        clock=clock,
    )
    engine = Engine(
        SMALL,
        wal=wal,
        metadata=metadata,
        storage=MemoryObjectStorage(),
        node_id=NodeId(1),
        node_epoch=info.node_epoch,
        lease_check=heartbeat.holds_lease,
    )
    heartbeat.add_listener(engine.fence)
    await engine.start()
    return Client(engine, metadata), heartbeat


def assert_node_fenced(error: BaseException) -> None:
    assert isinstance(error, FencedError), repr(error)
    assert error.code == ErrorCode.NODE_FENCED


async def test_appends_within_the_lease_are_acknowledged() -> None:
    clock, wal = Clock(), ReorderingWal()
    client, heartbeat = await leased_client(wal, clock)
    stream = await client.streams.create_and_open_stream()
    clock.s += 0.9
    assert await stream.append(RecordBatch(b"a")) == 0
    assert await client.append_atomic([(stream, RecordBatch(b"b"))], kv={"k": b"v"}) == [1]
    assert await client.kv.put("k2", b"w") == b"w"
    assert heartbeat.fenced is None
    assert not client.engine.fenced


@pytest.mark.parametrize("path", ["plain", "group", "kv"])
async def test_an_append_after_the_deadline_is_refused_before_the_wal(path: str) -> None:
    clock, wal = Clock(), ReorderingWal()
    client, heartbeat = await leased_client(wal, clock)
    stream = await client.streams.create_and_open_stream()
    written = wal.append_count
    clock.s += LEASE_MS / 1000
    attempt: Coroutine[Any, Any, object]
    if path == "plain":
        attempt = stream.append(RecordBatch(b"late"))
    elif path == "group":
        attempt = client.append_atomic([(stream, RecordBatch(b"late"))], kv={"k": b"v"})
    else:
        attempt = client.kv.put("k", b"late")
    with pytest.raises(FencedError) as raised:
        await attempt
    assert_node_fenced(raised.value)
    assert wal.append_count == written  # nothing reached the WAL
    assert client.engine.fenced
    assert heartbeat.fenced is not None
    assert (stream.confirm_offset, stream.next_offset) == (0, 0)


@pytest.mark.parametrize("path", ["plain", "group", "kv"])
async def test_an_append_whose_wal_write_returns_after_the_deadline_is_never_acknowledged(path: str) -> None:
    clock, wal = Clock(), ReorderingWal()
    client, _ = await leased_client(wal, clock)
    stream = await client.streams.create_and_open_stream()
    assert await stream.append(RecordBatch(b"before")) == 0
    wal.hold = True
    pending: asyncio.Task[object]
    if path == "plain":
        pending = asyncio.create_task(stream.append(RecordBatch(b"in flight")))
    elif path == "group":
        pending = asyncio.create_task(
            client.append_atomic([(stream, RecordBatch(b"in flight"))], kv={"k": b"v"})
        )
    else:
        pending = asyncio.create_task(client.kv.put("k", b"in flight"))
    await wal.wait_held(1)
    clock.s += LEASE_MS / 1000  # the process was paused past its lease while the write was in flight
    wal.held[0].set_result(None)  # the write is durable now
    with pytest.raises(FencedError) as raised:
        await pending
    assert_node_fenced(raised.value)
    assert client.engine.fenced
    assert stream.confirm_offset == 1  # the late record was never released
    assert await client.engine.metadata.kv_get("k") is None  # no KV change acknowledged or applied
    with pytest.raises(FencedError):
        await stream.append(RecordBatch(b"later"))


async def test_appends_in_flight_when_the_lease_ends_all_fail_and_later_ones_too() -> None:
    clock, wal = Clock(), ReorderingWal()
    client, _ = await leased_client(wal, clock)
    streams = [await client.streams.create_and_open_stream() for _ in range(2)]
    wal.hold = True
    pending = [asyncio.create_task(s.append(RecordBatch(bytes([i])))) for i in range(3) for s in streams]
    await wal.wait_held(len(pending))
    clock.s += LEASE_MS / 1000
    for release in reversed(wal.held):
        release.set_result(None)
    outcomes = await asyncio.gather(*pending, return_exceptions=True)
    assert all(isinstance(o, FencedError) for o in outcomes), outcomes
    assert [s.confirm_offset for s in streams] == [0, 0]


@pytest.mark.parametrize("path", ["plain", "group"])
async def test_an_append_whose_turn_comes_after_the_deadline_is_never_acknowledged(path: str) -> None:
    """A later append of a stream whose write returned first waits for the earlier one: the process can
    pause between the earlier one's acknowledgement (which hands the later one its turn) and the later
    one's wake-up; woken past the deadline it is not acknowledged."""
    clock, wal = Clock(), ReorderingWal()
    client, heartbeat = await leased_client(wal, clock)
    pause_after_next_check = [False]

    def lease() -> bool:
        held = heartbeat.holds_lease()
        if pause_after_next_check[0] and held:  # this check passes; the process pauses right after it
            pause_after_next_check[0] = False
            clock.s += LEASE_MS / 1000
        return held

    client.engine._appends.lease_check = lease
    stream = await client.streams.create_and_open_stream()
    wal.hold = True
    first = asyncio.create_task(stream.append(RecordBatch(b"first")))
    await wal.wait_held(1)
    later: asyncio.Task[object]
    if path == "plain":
        later = asyncio.create_task(stream.append(RecordBatch(b"later")))
    else:
        later = asyncio.create_task(client.append_atomic([(stream, RecordBatch(b"later"))], kv={"k": b"v"}))
    await wal.wait_held(2)
    wal.held[1].set_result(None)  # the later write returns first, within the lease: it waits its turn
    for _ in range(5):
        await asyncio.sleep(0)
    assert not later.done()
    pause_after_next_check[0] = True
    wal.held[0].set_result(None)
    assert await first == 0  # acknowledged within the lease
    with pytest.raises(FencedError) as raised:
        await later
    assert_node_fenced(raised.value)
    assert client.engine.fenced
