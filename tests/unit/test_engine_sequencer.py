"""The per-stream sequencer without queue entries: plain appends and atomic groups take their turns by
base offset, a stream close waits for appends in flight, failures reach appends waiting and in flight."""

from __future__ import annotations

import asyncio

import pytest

from s3stream.errors import FencedError, UnavailableError
from s3stream.model import RecordBatch
from tests.unit.test_engine import Node
from tests.unit.test_engine_append_path import ReorderingWal


async def test_a_plain_append_in_flight_needs_no_sequencer_state() -> None:
    wal = ReorderingWal()
    client = await Node(wal=wal).open()
    stream = await client.streams.create_and_open_stream()
    wal.hold = True
    first = asyncio.create_task(stream.append(RecordBatch(b"a")))
    await wal.wait_held(1)
    assert stream.handle.waiting == {}
    wal.held[0].set_result(None)
    assert await first == 0
    assert (stream.handle.waiting, stream.confirm_offset) == ({}, 1)
    await client.close()


async def test_a_group_and_plain_appends_take_their_turns_in_offset_order() -> None:
    wal = ReorderingWal()
    client = await Node(wal=wal).open()
    one = await client.streams.create_and_open_stream()
    two = await client.streams.create_and_open_stream()
    wal.hold = True
    plain = asyncio.create_task(one.append(RecordBatch(b"p0")))
    group = asyncio.create_task(
        client.append_atomic([(one, RecordBatch(b"g1")), (two, RecordBatch(b"g0"))], kv={"k": b"v"})
    )
    after = asyncio.create_task(one.append(RecordBatch(b"p2", count=3)))
    await wal.wait_held(3)
    wal.held[2].set_result(None)  # the last plain append first: waits behind the group
    await asyncio.sleep(0.01)
    wal.held[1].set_result(None)  # the group: waits behind the first plain append in `one`...
    await asyncio.sleep(0.01)
    assert (one.confirm_offset, two.confirm_offset) == (0, 0)  # ...and is parked at the head of `two`
    assert not group.done()
    assert not after.done()
    assert sorted(one.handle.waiting) == [1, 2]
    wal.held[0].set_result(None)
    assert await plain == 0
    assert await group == [1, 0]
    assert await after == 2
    assert (one.confirm_offset, two.confirm_offset, one.handle.waiting) == (5, 1, {})
    got = await one.fetch(0, 5)
    assert [(b.base_offset, b.payload) for b in got] == [(0, b"p0"), (1, b"g1"), (2, b"p2")]
    assert await client.kv.get("k") == b"v"
    await client.close()


async def test_a_stream_close_waits_for_its_appends_in_flight() -> None:
    wal = ReorderingWal()
    client = await Node(wal=wal).open()
    stream = await client.streams.create_and_open_stream()
    wal.hold = True
    appends = [asyncio.create_task(stream.append(RecordBatch(bytes([i])))) for i in range(3)]
    await wal.wait_held(3)
    wal.hold = False
    closing = asyncio.create_task(stream.close())
    wal.held[2].set_result(None)
    wal.held[1].set_result(None)
    await asyncio.sleep(0.01)
    assert not closing.done()  # the first append is still in flight
    wal.held[0].set_result(None)
    assert await asyncio.gather(*appends) == [0, 1, 2]
    await closing
    reopened = await client.streams.open_stream(stream.stream_id, epoch=stream.epoch + 1)
    assert [b.payload for b in await reopened.fetch(0, 3)] == [b"\x00", b"\x01", b"\x02"]
    await client.close()


async def test_a_failed_append_fails_its_streams_appends_in_flight_and_a_waiting_close() -> None:
    wal = ReorderingWal()
    client = await Node(wal=wal).open()
    stream = await client.streams.create_and_open_stream()
    first, second = await wal.held_appends(stream, b"a", b"b")
    closing = asyncio.create_task(stream.close())
    await asyncio.sleep(0)
    wal.held[0].set_exception(UnavailableError("disk gone"))
    with pytest.raises(UnavailableError):
        await first
    await closing  # the close stops waiting for appends that fail
    wal.held[1].set_result(None)  # durable after the failure: fails with the fence
    with pytest.raises(FencedError):
        await second
    assert stream.confirm_offset == 0
    assert client.engine._trim_tracker.live_bytes == 0
    await client.close()


async def test_a_chain_of_groups_completed_newest_first_is_released_in_order_in_one_pass() -> None:
    wal = ReorderingWal()
    client = await Node(wal=wal).open()
    streams = [await client.streams.create_and_open_stream() for _ in range(3)]
    wal.hold = True
    count = 600  # more than the recursion limit's worth of groups, each waiting for the previous
    groups = [
        asyncio.create_task(
            client.append_atomic(
                [(streams[i % 3], RecordBatch(b"a")), (streams[(i + 1) % 3], RecordBatch(b"b"))]
            )
        )
        for i in range(count)
    ]
    await wal.wait_held(count)
    for release in reversed(wal.held):
        release.set_result(None)
    results = await asyncio.gather(*groups)
    assert [s.confirm_offset for s in streams] == [2 * count // 3] * 3
    assert results[:3] == [[0, 0], [1, 0], [1, 1]]
    await client.close()
