"""An atomic group that fails through one of its streams: readable in none of them, every stream it
touches fenced (no offset handed out is a silent hole), nothing left live in the WAL trim tracker,
and every acknowledged append kept."""

from __future__ import annotations

import asyncio

import pytest

from s3stream.engine.client import Client, Stream
from s3stream.errors import FencedError, UnavailableError
from s3stream.model import RecordBatch
from tests.unit.test_engine import Node
from tests.unit.test_engine_append_path import ReorderingWal


async def _two_streams(wal: ReorderingWal) -> tuple[Node, Client, Stream, Stream]:
    node = Node(wal=wal)
    client = await node.open()
    one = await client.streams.create_and_open_stream()
    two = await client.streams.create_and_open_stream()
    return node, client, one, two


def _nothing_live(client: Client) -> None:
    live = client.engine._trim_tracker
    assert (len(live), live.live_bytes, live.inflight) == (0, 0, {})


async def test_a_group_durable_after_its_stream_failed_fails_and_fences_its_other_streams() -> None:
    wal = ReorderingWal()
    node, client, one, two = await _two_streams(wal)
    await two.append(RecordBatch(b"acked"))  # two's offset 0: acknowledged before the failure
    wal.hold = True
    plain = asyncio.create_task(one.append(RecordBatch(b"p")))
    group = asyncio.create_task(client.append_atomic([(one, RecordBatch(b"g1")), (two, RecordBatch(b"g2"))]))
    await wal.wait_held(2)
    wal.held[0].set_exception(UnavailableError("disk gone"))  # fences `one`
    with pytest.raises(UnavailableError):
        await plain
    wal.held[1].set_result(None)  # the group is durable, but `one` failed meanwhile
    with pytest.raises(FencedError):
        await group
    assert two.confirm_offset == 1  # never past the group's offset, which holds no data
    with pytest.raises(FencedError):
        await two.fetch(0, 1)
    with pytest.raises(FencedError):
        await two.append(RecordBatch(b"after"))
    await client.engine.force_upload(None)  # commits the acknowledged append
    _nothing_live(client)  # the failed group pins nothing
    await client.close()
    client = await node.open()
    again = await client.streams.open_stream(two.stream_id, epoch=two.epoch + 1)
    assert [b.payload for b in await again.fetch(0, 1)] == [b"acked"]
    await client.close()


async def test_a_group_waiting_in_a_stream_whose_append_fails_fails_and_pins_nothing() -> None:
    wal = ReorderingWal()
    _, client, one, two = await _two_streams(wal)
    wal.hold = True
    plain = asyncio.create_task(one.append(RecordBatch(b"p")))
    group = asyncio.create_task(client.append_atomic([(one, RecordBatch(b"g1")), (two, RecordBatch(b"g2"))]))
    behind = asyncio.create_task(two.append(RecordBatch(b"behind the group")))
    await wal.wait_held(3)
    wal.held[1].set_result(None)  # the group: first in `two`, behind the plain append in `one`
    wal.held[2].set_result(None)
    await asyncio.sleep(0.01)
    assert two.confirm_offset == 0  # a group is readable in none of its streams until acknowledged
    assert not group.done()
    wal.held[0].set_exception(UnavailableError("disk gone"))
    with pytest.raises(UnavailableError):
        await plain
    with pytest.raises(FencedError):
        await group
    with pytest.raises(FencedError):
        await behind
    assert (one.confirm_offset, two.confirm_offset) == (0, 0)
    with pytest.raises(FencedError):
        await two.fetch(0, 0)
    _nothing_live(client)
    await client.close()


async def test_a_group_with_kv_puts_failing_after_it_is_durable_pins_the_wal_only_until_applied() -> None:
    wal = ReorderingWal()
    _, client, one, two = await _two_streams(wal)
    wal.hold = True
    plain = asyncio.create_task(one.append(RecordBatch(b"p")))
    group = asyncio.create_task(
        client.append_atomic([(one, RecordBatch(b"g1")), (two, RecordBatch(b"g2"))], kv={"k": b"v"})
    )
    await wal.wait_held(2)
    wal.held[0].set_exception(UnavailableError("disk gone"))
    with pytest.raises(UnavailableError):
        await plain
    wal.held[1].set_result(None)
    with pytest.raises(FencedError):
        await group
    # The KV put is in the WAL, which recovery replays in order: it is applied like any durable one.
    for _ in range(100):
        if await client.kv.get("k") is not None and len(client.engine._trim_tracker) == 0:
            break
        await asyncio.sleep(0.01)
    assert await client.kv.get("k") == b"v"
    _nothing_live(client)
    await client.close()


async def test_a_failing_group_fences_every_stream_linked_to_it_by_waiting_groups() -> None:
    wal = ReorderingWal()
    client = await Node(wal=wal).open()
    one, two, three = [await client.streams.create_and_open_stream() for _ in range(3)]
    wal.hold = True
    plain = asyncio.create_task(one.append(RecordBatch(b"p")))
    first = asyncio.create_task(client.append_atomic([(one, RecordBatch(b"a")), (two, RecordBatch(b"b"))]))
    second = asyncio.create_task(client.append_atomic([(two, RecordBatch(b"c")), (three, RecordBatch(b"d"))]))
    await wal.wait_held(3)
    wal.held[2].set_result(None)
    wal.held[1].set_result(None)
    await asyncio.sleep(0.01)
    wal.held[0].set_exception(UnavailableError("disk gone"))
    with pytest.raises(UnavailableError):
        await plain
    for task in (first, second):
        with pytest.raises(FencedError):
            await task
    assert [s.confirm_offset for s in (one, two, three)] == [0, 0, 0]
    with pytest.raises(FencedError):
        await three.append(RecordBatch(b"x"))
    _nothing_live(client)
    await client.close()
