"""External commits on a live engine (real Ceph RGW, SQLite metadata): objects written by
``s3stream.direct.writer`` outside the WAL are committed by ``Client.commit_objects`` without losing, hiding
or reordering anything the engine holds."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from s3stream import RecordBatch
from s3stream.assembly import open_client
from s3stream.config import Config
from s3stream.direct.writer import WrittenObjectInfo, write_object
from s3stream.engine.client import Client, Stream
from s3stream.engine.kvlog import DIRECT_KV_PREFIX
from s3stream.engine.stream import Status
from s3stream.errors import ConflictError, ErrorCode, InvalidArgumentError
from s3stream.ids import ObjectId
from s3stream.metadata.base import ObjectKind
from s3stream.objectformat.writer import RecordFields
from tests.support.s3 import S3TestServer

pytestmark = pytest.mark.integration

CONFIG = Config(
    wal_capacity_bytes=32 << 20,
    wal_record_max_bytes=2 << 20,
    record_max_bytes=1 << 20,
    wal_cache_size_bytes=16 << 20,
    wal_upload_threshold_bytes=8 << 20,
    wal_upload_interval_ms=3_600_000,  # appended data stays in the WAL and LogCache until forced up
    upload_retry_backoff_ms=20,
)
PROGRESS = DIRECT_KV_PREFIX + "test/progress"


def payload(stream_id: int, offset: int, source: str) -> bytes:
    return f"{source}:{stream_id}:{offset}".encode().ljust(200, b".")


def external_batches(stream: Stream, start: int, count: int) -> list[RecordFields]:
    return [
        (stream.stream_id, stream.epoch, o, 1, payload(stream.stream_id, o, "ext"))
        for o in range(start, start + count)
    ]


async def write(uri: str, client: Client, object_id: int, records: list[RecordFields]) -> WrittenObjectInfo:
    return await asyncio.to_thread(write_object, uri, client.config.namespace, object_id, records)


async def read_all(stream: Stream) -> list[tuple[int, bytes]]:
    """Every batch from 0 to the confirm offset (a fetch may return a prefix: fetch again from its end)."""
    out: list[tuple[int, bytes]] = []
    while not out or out[-1][0] + 1 < stream.confirm_offset:
        start = out[-1][0] + 1 if out else 0
        got = await stream.fetch(start, stream.confirm_offset, max_bytes=1 << 30)
        assert got, start
        assert got[0].base_offset == start
        out += [(b.base_offset, bytes(b.payload)) for b in got]
    return out


async def test_a_commit_uploads_the_engines_held_data_first_and_moves_the_offsets(
    tmp_path: Path, s3_server: S3TestServer, s3_prefix: str
) -> None:
    uri = s3_server.uri(s3_prefix)
    client = await open_client(tmp_path, bucket_uri=uri, config=CONFIG)
    stream = await client.streams.create_and_open_stream()
    sid = stream.stream_id
    for o in range(10):  # acknowledged, held in the WAL and the LogCache
        assert await stream.append(RecordBatch(payload(sid, o, "wal"))) == o
    assert client.engine.stats.uploads == 0
    first = await client.prepare_objects(2, ttl_ms=60_000)
    info = await write(uri, client, first, external_batches(stream, 10, 5))
    await client.commit_objects(
        [stream], [info.committed()], kv_puts={PROGRESS: b"1"}, release_ids=[ObjectId(first + 1)]
    )
    assert client.engine.stats.uploads == 1  # the held data went up before the commit
    assert (stream.next_offset, stream.confirm_offset) == (15, 15)
    assert stream.handle.status is Status.OPEN
    meta = await client.engine.metadata.describe_stream(sid)
    assert meta.end_offset == 15
    assert await client.kv.get(PROGRESS) == b"1"
    assert await stream.append(RecordBatch(payload(sid, 15, "wal"))) == 15
    expected = [(o, payload(sid, o, "wal" if o < 10 or o == 15 else "ext")) for o in range(16)]
    assert await read_all(stream) == expected
    await client.close()

    again = await open_client(tmp_path, bucket_uri=uri, config=CONFIG)
    reopened = await again.streams.open_stream(sid, epoch=1)
    assert await read_all(reopened) == expected
    slices = await again.engine.metadata.get_objects(stream_id=sid, start_offset=0, end_offset=-1, limit=100)
    assert [(s.start_offset, s.end_offset) for s in slices] == [(0, 10), (10, 15), (15, 16)]
    assert (await again.engine.metadata.get_object(ObjectId(first + 1))).state.name == "MARK_DESTROYED"
    await again.close()


async def test_objects_committed_out_of_id_order_are_read_in_offset_order(
    tmp_path: Path, s3_server: S3TestServer, s3_prefix: str
) -> None:
    uri = s3_server.uri(s3_prefix)
    client = await open_client(tmp_path, bucket_uri=uri, config=CONFIG)
    a = await client.streams.create_and_open_stream()
    b = await client.streams.create_and_open_stream()
    low = await client.prepare_objects(2, ttl_ms=60_000)
    # the higher id holds the first offsets and is committed first; an engine upload follows (its id
    # is above both); the lower id holds the last offsets and is committed last
    early = await write(uri, client, low + 1, external_batches(a, 0, 4) + external_batches(b, 0, 2))
    await client.commit_objects([a, b], [early.committed()])
    await stream_append(a, 4)
    late = await write(uri, client, low, external_batches(a, 8, 3) + external_batches(b, 2, 3))
    await client.commit_objects([a, b], [late.committed()])
    slices = await client.engine.metadata.get_objects(
        stream_id=b.stream_id, start_offset=0, end_offset=-1, limit=10
    )
    assert [(s.object_id, s.kind, s.start_offset, s.end_offset) for s in slices] == [
        (low + 1, ObjectKind.STREAM_SET, 0, 2),
        (low, ObjectKind.STREAM_SET, 2, 5),
    ]
    assert [o for o, _ in await read_all(a)] == list(range(11))
    assert await read_all(b) == [(o, payload(b.stream_id, o, "ext")) for o in range(5)]
    await client.close()
    again = await open_client(tmp_path, bucket_uri=uri, config=CONFIG)
    for stream, n in ((a, 11), (b, 5)):
        reopened = await again.streams.open_stream(stream.stream_id, epoch=1)
        assert [o for o, _ in await read_all(reopened)] == list(range(n))
    await again.close()


async def stream_append(stream: Stream, offset: int) -> None:
    """Append one WAL batch at ``offset`` and force it up (an engine upload with a fresh id)."""
    assert stream.next_offset == offset
    for o in range(offset, offset + 4):
        await stream.append(RecordBatch(payload(stream.stream_id, o, "wal")))
    await stream.engine.force_upload(stream.stream_id)


async def test_a_reserved_stream_refuses_appends_and_lets_the_ones_in_flight_finish(
    tmp_path: Path, s3_server: S3TestServer, s3_prefix: str
) -> None:
    client = await open_client(tmp_path, bucket_uri=s3_server.uri(s3_prefix), config=CONFIG)
    stream = await client.streams.create_and_open_stream()
    other = await client.streams.create_and_open_stream()
    in_flight = asyncio.ensure_future(stream.append(RecordBatch(b"before")))
    await asyncio.sleep(0)  # the append took its offset and waits for the WAL
    client.engine.reserve_streams([stream.handle], "a test")
    with pytest.raises(ConflictError, match="reserved by a test"):
        await stream.append(RecordBatch(b"refused"))
    with pytest.raises(ConflictError, match="reserved by a test"):
        await client.append_atomic([(other, RecordBatch(b"x")), (stream, RecordBatch(b"y"))])
    assert await in_flight == 0
    assert await other.append(RecordBatch(b"other")) == 0  # other streams are not held
    assert [b.payload for b in await stream.fetch(0, 1)] == [b"before"]  # readable while reserved
    client.engine.release_streams([stream.handle])
    assert await stream.append(RecordBatch(b"after")) == 1
    await client.close()


async def test_a_commit_that_does_not_continue_at_the_end_changes_nothing(
    tmp_path: Path, s3_server: S3TestServer, s3_prefix: str
) -> None:
    uri = s3_server.uri(s3_prefix)
    client = await open_client(tmp_path, bucket_uri=uri, config=CONFIG)
    stream = await client.streams.create_and_open_stream()
    await stream.append(RecordBatch(payload(stream.stream_id, 0, "wal")))
    first = await client.prepare_objects(1, ttl_ms=60_000)
    stale = await write(uri, client, first, external_batches(stream, 0, 3))  # planned before the append
    with pytest.raises(ConflictError) as info:
        await client.commit_objects([stream], [stale.committed()], kv_puts={PROGRESS: b"1"})
    assert info.value.code == ErrorCode.OFFSET_NOT_MATCHED
    assert await client.kv.get(PROGRESS) is None
    assert (stream.next_offset, stream.confirm_offset) == (1, 1)
    assert stream.handle.status is Status.OPEN  # released: appends go on
    assert await stream.append(RecordBatch(b"next")) == 1
    fresh = await write(uri, client, await client.prepare_objects(1), external_batches(stream, 2, 3))
    with pytest.raises(ConflictError) as info:  # the KV condition fails: nothing committed either
        await client.commit_objects([stream], [fresh.committed()], kv_expect={PROGRESS: b"0"})
    assert info.value.code == ErrorCode.KV_CONDITION_FAILED
    assert (await client.engine.metadata.describe_stream(stream.stream_id)).end_offset == 2
    assert await stream.append(RecordBatch(b"again")) == 2
    await client.close()


async def test_direct_keys_never_go_through_the_wal_and_commits_write_only_direct_keys(
    tmp_path: Path, s3_server: S3TestServer, s3_prefix: str
) -> None:
    uri = s3_server.uri(s3_prefix)
    client = await open_client(tmp_path, bucket_uri=uri, config=CONFIG)
    stream = await client.streams.create_and_open_stream()
    with pytest.raises(InvalidArgumentError, match="never through the WAL"):
        await client.kv.put(PROGRESS, b"1")
    with pytest.raises(InvalidArgumentError, match="never through the WAL"):
        await client.kv.delete(PROGRESS)
    with pytest.raises(InvalidArgumentError, match="never through the WAL"):
        await client.append_atomic([(stream, RecordBatch(b"x"))], kv={PROGRESS: b"1"})
    first = await client.prepare_objects(1)
    info = await write(uri, client, first, external_batches(stream, 0, 2))
    with pytest.raises(InvalidArgumentError, match="only KV keys under"):
        await client.commit_objects([stream], [info.committed()], kv_puts={"plain": b"1"})
    assert stream.next_offset == 0
    assert await client.kv.get(PROGRESS) is None
    await client.close()
