"""Conditional appends: an expected base offset is checked when the engine assigns offsets; a
mismatch is a ConflictError that writes nothing and changes no state (offsets, WAL, KV, stream status).
"""

from __future__ import annotations

import asyncio

import pytest

from s3stream.engine.client import Client, Stream
from s3stream.errors import ConflictError, InvalidArgumentError
from s3stream.model import RecordBatch
from tests.unit.test_engine import Node
from tests.unit.test_engine_append_path import ReorderingWal
from tests.unit.test_facade import sync_client


async def _streams(count: int, wal: ReorderingWal | None = None) -> tuple[Node, Client, list[Stream]]:
    node = Node(wal=wal)
    client = await node.open()
    return node, client, [await client.streams.create_and_open_stream() for _ in range(count)]


def _state(node: Node, client: Client, streams: list[Stream]) -> tuple[object, ...]:
    """Everything a refused append must leave as it was."""
    live = client.engine._trim_tracker
    return (
        [(s.next_offset, s.confirm_offset, s.handle.status, s.handle.append_failure) for s in streams],
        node.wal.append_count,
        dict(node.wal.records),
        client.engine._appends._seq,
        (len(live), live.live_bytes, dict(live.inflight)),
        client.engine.stats.appended_records,
    )


async def test_an_append_at_its_expected_offset_is_appended() -> None:
    _, client, (one, two) = await _streams(2)
    assert await one.append(RecordBatch(b"a"), expected_offset=0) == 0
    assert await one.append(RecordBatch(b"bc", count=2), expected_offset=1) == 1
    bases = await client.append_atomic(
        [
            (one, RecordBatch(b"d"), 3),
            (two, RecordBatch(b"e"), 0),
            (one, RecordBatch(b"f"), 4),  # a second batch of the same stream follows the first
            (two, RecordBatch(b"g")),  # no condition on this one
        ]
    )
    assert bases == [3, 0, 4, 1]
    assert [b.payload for b in await one.fetch(0, 5)] == [b"a", b"bc", b"d", b"f"]
    assert [b.payload for b in await two.fetch(0, 2)] == [b"e", b"g"]
    await client.close()


async def test_a_stream_append_at_another_offset_is_refused_and_changes_nothing() -> None:
    node, client, streams = await _streams(1)
    (stream,) = streams
    await stream.append(RecordBatch(b"a"))
    before = _state(node, client, streams)
    with pytest.raises(ConflictError, match=rf"stream {stream.stream_id}: .* offset 5, .*next offset is 1"):
        await stream.append(RecordBatch(b"x"), expected_offset=5)
    with pytest.raises(ConflictError, match="offset 0"):
        await stream.append(RecordBatch(b"x"), expected_offset=0)
    assert _state(node, client, streams) == before
    assert await stream.append(RecordBatch(b"b"), expected_offset=1) == 1, "no offset was taken"
    assert [b.payload for b in await stream.fetch(0, 2)] == [b"a", b"b"]
    await client.close()


async def test_a_mismatch_in_one_stream_of_a_group_writes_nothing_of_the_group() -> None:
    node, client, streams = await _streams(3)
    one, two, three = streams
    await two.append(RecordBatch(b"two's first"))
    before = _state(node, client, streams)
    with pytest.raises(ConflictError, match=rf"stream {two.stream_id}: .* offset 0, .*next offset is 1"):
        await client.append_atomic(
            [(one, RecordBatch(b"g1"), 0), (two, RecordBatch(b"g2"), 0), (three, RecordBatch(b"g3"), 0)],
            kv={"k": b"v"},
        )
    # the second batch of a stream is checked against the first one's end, not the stream's end
    with pytest.raises(ConflictError, match=rf"stream {one.stream_id}: .* offset 0, .*next offset is 1"):
        await client.append_atomic([(one, RecordBatch(b"g1"), 0), (one, RecordBatch(b"g1b"), 0)])
    assert _state(node, client, streams) == before
    assert await client.kv.get("k") is None, "the group's KV put was not applied"
    bases = await client.append_atomic(
        [(one, RecordBatch(b"g1"), 0), (two, RecordBatch(b"g2"), 1), (three, RecordBatch(b"g3"), 0)],
        kv={"k": b"v"},
    )
    assert bases == [0, 1, 0], "every stream is still open, no offset was taken"
    assert await client.kv.get("k") == b"v"
    await client.close()
    client = await node.open()  # the refused groups left nothing in the WAL to replay
    assert await client.kv.get("k") == b"v"
    again = await client.streams.open_stream(two.stream_id, epoch=two.epoch + 1)
    assert [b.payload for b in await again.fetch(0, 2)] == [b"two's first", b"g2"]
    await client.close()


async def test_the_check_is_against_offsets_assigned_so_far_in_submission_order() -> None:
    wal = ReorderingWal()
    _, client, (stream,) = await _streams(1, wal)
    (held,) = await wal.held_appends(stream, b"in flight")  # offset 0 taken, not yet acknowledged
    assert (stream.next_offset, stream.confirm_offset) == (1, 0)
    with pytest.raises(ConflictError, match="offset 0"):
        await stream.append(RecordBatch(b"x"), expected_offset=0)
    wal.hold = False
    # racing appends, started in this order: the conditional ones that lost the race are refused
    tasks = [
        asyncio.create_task(stream.append(RecordBatch(b"c1"), expected_offset=1)),
        asyncio.create_task(stream.append(RecordBatch(b"plain"))),
        asyncio.create_task(stream.append(RecordBatch(b"c2"), expected_offset=2)),
        asyncio.create_task(stream.append(RecordBatch(b"c3"), expected_offset=2)),
        asyncio.create_task(client.append_atomic([(stream, RecordBatch(b"c4"), 3)])),
    ]
    await asyncio.sleep(0.01)
    wal.held[0].set_result(None)
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    assert await held == 0
    assert outcomes[:2] == [1, 2]
    assert all(isinstance(o, ConflictError) for o in outcomes[2:4])
    assert outcomes[4] == [3]
    assert [b.payload for b in await stream.fetch(0, 4)] == [b"in flight", b"c1", b"plain", b"c4"]
    await client.close()


async def test_bad_expected_offsets_are_invalid_arguments() -> None:
    _, client, (stream,) = await _streams(1)
    for bad in (-1, True, "0", 1.0):
        with pytest.raises(InvalidArgumentError, match="expected offset"):
            await stream.append(RecordBatch(b"x"), expected_offset=bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError, match="expected offset"):
            await client.append_atomic([(stream, RecordBatch(b"x"), bad)])  # type: ignore[list-item]
    with pytest.raises(InvalidArgumentError, match="tuples"):
        await client.append_atomic([(stream, RecordBatch(b"x"), 0, 0)])  # type: ignore[list-item]
    assert stream.next_offset == 0
    await client.close()


def test_the_sync_facade_passes_expected_offsets() -> None:
    with sync_client() as client:
        one = client.streams.create_and_open_stream()
        two = client.streams.create_and_open_stream()
        assert one.append(RecordBatch(b"a"), expected_offset=0) == 0
        assert one.append(RecordBatch(b"b"), 1) == 1
        with pytest.raises(ConflictError, match="next offset is 2"):
            one.append(RecordBatch(b"x"), expected_offset=1)
        assert client.append_atomic([(one, RecordBatch(b"c"), 2), (two, RecordBatch(b"d"))]) == [2, 0]
        with pytest.raises(ConflictError, match=rf"stream {two.stream_id}"):
            client.append_atomic([(one, RecordBatch(b"e"), 3), (two, RecordBatch(b"f"), 0)], kv={"k": b"v"})
        assert (one.next_offset, two.next_offset, client.kv.get("k")) == (3, 1, None)
