"""The WAL trim rule seen from the engine: never past an append in flight, a record of an uncommitted
LogCache block or a durable append held back by its stream's sequencer; a failed append pins nothing."""

from __future__ import annotations

import asyncio

import pytest

from s3stream.errors import FencedError, UnavailableError
from s3stream.model import RecordBatch
from tests.unit.test_engine import Node
from tests.unit.test_engine_append_path import ReorderingWal


async def test_the_wal_is_never_trimmed_past_an_append_in_flight() -> None:
    wal = ReorderingWal()
    client = await Node(wal=wal).open()
    done = await client.streams.create_and_open_stream()
    busy = await client.streams.create_and_open_stream()
    wal.hold = True
    in_flight = asyncio.create_task(busy.append(RecordBatch(b"in flight")))
    await wal.wait_held(1)
    in_flight_offset = max(wal.records)
    wal.hold = False
    await done.append(RecordBatch(b"written later, committed first"))
    assert max(wal.records) > in_flight_offset
    await client.engine.force_upload(done.stream_id)  # commits the later record's block
    await asyncio.sleep(0)
    assert wal.trim_calls
    assert max(wal.trim_calls) <= in_flight_offset
    assert in_flight_offset in wal.records
    wal.held[0].set_result(None)
    assert await in_flight == 0
    await client.engine.force_upload(None)
    await asyncio.sleep(0)
    assert wal.records == {}  # everything committed: trimmed past the last record
    assert client.engine._trim_tracker.live_bytes == 0
    await client.close()


async def test_the_wal_keeps_the_records_of_a_block_until_the_block_commits() -> None:
    wal = ReorderingWal()
    client = await Node(wal=wal).open()
    first = await client.streams.create_and_open_stream()
    second = await client.streams.create_and_open_stream()
    await first.append(RecordBatch(b"a"))
    client.engine._pipeline.archive_and_upload()  # block 1: first's record (uploading)
    await second.append(RecordBatch(b"b"))  # block 2, the active one: not committed
    kept = max(wal.records)
    await client.engine.force_upload(first.stream_id)
    await asyncio.sleep(0)
    assert kept in wal.records
    assert max(wal.trim_calls) <= kept
    await client.engine.force_upload(None)
    await asyncio.sleep(0)
    assert wal.records == {}
    await client.close()


async def test_appends_completing_out_of_order_are_trimmed_once_committed() -> None:
    wal = ReorderingWal()
    client = await Node(wal=wal).open()
    stream = await client.streams.create_and_open_stream()
    wal.hold = True
    tasks = [asyncio.create_task(stream.append(RecordBatch(bytes([i])))) for i in range(4)]
    await wal.wait_held(4)
    for release in reversed(wal.held):  # the later ones are durable first and held back
        release.set_result(None)
        await asyncio.sleep(0)
    assert await asyncio.gather(*tasks) == [0, 1, 2, 3]
    wal.hold = False
    await client.engine.force_upload(None)
    await asyncio.sleep(0)
    assert wal.records == {}
    assert client.engine._trim_tracker.live_bytes == 0
    await client.close()


async def test_a_failed_append_and_its_fenced_durable_successor_pin_no_wal_record() -> None:
    wal = ReorderingWal()
    client = await Node(wal=wal).open()
    stream = await client.streams.create_and_open_stream()
    other = await client.streams.create_and_open_stream()
    first, second = await wal.held_appends(stream, b"a", b"b")
    wal.held[1].set_result(None)  # durable, held back behind the first
    await asyncio.sleep(0)
    wal.held[0].set_exception(UnavailableError("disk gone"))
    with pytest.raises(UnavailableError):
        await first
    with pytest.raises(FencedError):
        await second
    assert client.engine._trim_tracker.live_bytes == 0
    wal.hold = False
    await other.append(RecordBatch(b"c"))
    await client.engine.force_upload(None)
    await asyncio.sleep(0)
    assert wal.records == {}  # the fenced stream's durable record does not hold the WAL
    await client.close()
