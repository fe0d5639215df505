"""Readers without a data dir (s3stream.open_reader): the same fetch results as Stream.fetch for uploaded
data, SQLite metadata read without writing, re-planning when compaction replaced the objects, bad
arguments. Local object storage (file://) and real SQLite; the other-process test is in
tests/integration/test_remote_reader_s3.py."""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import cast

import pytest

import s3stream
from s3stream import Client, Config, RecordBatch, Stream
from s3stream.engine.blockcache import BlockCache
from s3stream.engine.reader import ObjectStreamReader
from s3stream.engine.readstate import ReadaheadSettings
from s3stream.errors import (
    ClosedError,
    ConflictError,
    InvalidArgumentError,
    NotFoundError,
    OffsetOutOfRangeError,
)
from s3stream.ids import StreamId
from s3stream.metadata.base import MetadataStore, ObjectState
from s3stream.metadata.sqlite_readonly import ReadOnlySqliteStore
from s3stream.metadata.url import open_metadata_store
from s3stream.model import FetchedBatch
from s3stream.objectformat import ObjectReaderCache
from s3stream.remote import Reader
from s3stream.storage.local import LocalObjectStorage
from tests.support.configs import KiB, small_config

FAST = small_config(
    wal_upload_interval_ms=50, object_delete_retention_minutes=0, object_block_size_bytes=8 * KiB
)
"""Blocks uploaded 50 ms after their first record; replaced objects deleted at the next GC."""


def urls(data: Path) -> dict[str, str]:
    return {"metadata_url": f"sqlite://{data / 'metadata.db'}", "bucket_uri": f"file://{data / 'objects'}"}


def rows(batches: Sequence[FetchedBatch]) -> list[tuple[int, int, bytes]]:
    return [(b.base_offset, b.count, bytes(b.payload)) for b in batches]


def payload(stream: int, offset: int, size: int = 700) -> bytes:
    return (f"s{stream}-o{offset}-".encode() * (size // 8 + 1))[:size]


async def wait_uploaded(client: Client, stream: Stream, end: int) -> None:
    for _ in range(400):
        if (await client.engine.metadata.describe_stream(stream.stream_id)).end_offset >= end:
            return
        await asyncio.sleep(0.025)
    raise AssertionError(f"stream {stream.stream_id} was not uploaded to {end}")


async def fill(client: Client, streams: Sequence[Stream], *, rounds: int, per_round: int) -> None:
    """``rounds`` uploads (one StreamSet object each) of ``per_round`` batches of every stream."""
    for _ in range(rounds):
        for stream in streams:
            for _ in range(per_round):
                offset = stream.next_offset
                count = 1 + offset % 3
                await stream.append(RecordBatch(payload(stream.stream_id, offset), count=count))
        for stream in streams:
            await wait_uploaded(client, stream, stream.next_offset)


async def test_fetch_returns_what_stream_fetch_returns_for_uploaded_data(tmp_path: Path) -> None:
    data = tmp_path / "data"
    client = await s3stream.open(data, config=FAST)
    try:
        streams = [await client.streams.create_and_open_stream() for _ in range(2)]
        await fill(client, streams, rounds=3, per_round=15)
        async with await s3stream.open_reader(**urls(data), config=FAST) as reader:
            listed = {m.stream_id: m for m in await reader.list_streams()}
            assert set(listed) == {s.stream_id for s in streams}
            for stream in streams:
                end = stream.confirm_offset
                assert listed[stream.stream_id].end_offset == end
                for start, stop, max_bytes in [
                    (0, end, 1 << 20),
                    (1, end - 1, 1),
                    (5, 40, 3000),
                    (end - 1, end, 1),
                ]:
                    want = await stream.fetch(start, stop, max_bytes)
                    got = await reader.fetch(stream.stream_id, start, stop, max_bytes)
                    assert rows(got) == rows(want), (stream.stream_id, start, stop, max_bytes)
                    assert got
                    assert got[0].base_offset <= start
                assert await reader.fetch(stream.stream_id, end, end) == []
    finally:
        await client.close()


async def test_beyond_the_uploaded_end_is_out_of_range_like_beyond_the_confirm_offset(tmp_path: Path) -> None:
    data = tmp_path / "data"
    client = await s3stream.open(data, config=small_config(wal_upload_interval_ms=60_000))
    try:
        stream = await client.streams.create_and_open_stream()
        await stream.append(RecordBatch(b"acknowledged, not uploaded"))
        async with await s3stream.open_reader(**urls(data)) as reader:
            assert (await reader.describe_stream(stream.stream_id)).end_offset == 0
            with pytest.raises(OffsetOutOfRangeError):
                await reader.fetch(stream.stream_id, 0, 1)
            with pytest.raises(OffsetOutOfRangeError):
                await stream.fetch(0, 2)  # the writer's own rule past its end
            assert await reader.fetch(stream.stream_id, 0, 0) == []
            with pytest.raises(NotFoundError):
                await reader.fetch(StreamId(stream.stream_id + 100), 0, 0)
            await stream.close()  # uploads
            got = await reader.fetch(stream.stream_id, 0, 1)
            assert rows(got) == [(0, 1, b"acknowledged, not uploaded")]
            await client.streams.open_stream(stream.stream_id, epoch=1)  # writer goes on: reader follows
    finally:
        await client.close()


def file_state(data: Path) -> tuple[list[str], str, int]:
    db = data / "metadata.db"
    return sorted(os.listdir(data)), hashlib.sha256(db.read_bytes()).hexdigest(), db.stat().st_mtime_ns


async def test_sqlite_metadata_is_read_without_writing_or_creating_a_file(tmp_path: Path) -> None:
    data = tmp_path / "data"
    client = await s3stream.open(data, config=FAST)
    stream = await client.streams.create_and_open_stream()
    await fill(client, [stream], rounds=2, per_round=5)
    await client.close()  # no process has the database open: no -wal file
    before = file_state(data)
    assert not any(name.endswith(("-wal", "-shm")) for name in before[0])
    reader = await s3stream.open_reader(**urls(data))
    assert [m.end_offset for m in await reader.list_streams()] == [stream.next_offset]
    assert rows(await reader.fetch(stream.stream_id, 0, 3))[0][0] == 0
    with pytest.raises(InvalidArgumentError, match="read-only"):
        await reader.metadata.kv_put("k", b"v")
    await reader.close()
    assert file_state(data) == before


async def test_a_reader_follows_a_writer_that_opens_after_it(tmp_path: Path) -> None:
    data = tmp_path / "data"
    client = await s3stream.open(data, config=FAST)
    stream = await client.streams.create_and_open_stream()
    await fill(client, [stream], rounds=1, per_round=4)
    await client.close()
    first_end = stream.next_offset
    async with await s3stream.open_reader(**urls(data)) as reader:
        assert [m.end_offset for m in await reader.list_streams()] == [first_end]
        writer = await s3stream.open(data, config=FAST)  # the database now changes under the reader
        try:
            again = await writer.streams.open_stream(stream.stream_id, epoch=1)
            await fill(writer, [again], rounds=2, per_round=4)
            end = again.next_offset
            assert [m.end_offset for m in await reader.list_streams()] == [end]
            want = await again.fetch(0, end, 1 << 20)
            assert rows(await reader.fetch(stream.stream_id, 0, end, 1 << 20)) == rows(want)
        finally:
            await writer.close()
        assert [m.end_offset for m in await reader.list_streams()] == [end]


async def fill_by_close(
    client: Client, streams: list[Stream], *, rounds: int, per_round: int
) -> list[Stream]:
    """``rounds`` StreamSet objects holding every stream: each round's block is uploaded by closing the
    first stream (which is then reopened)."""
    for _ in range(rounds):
        for stream in streams:
            for _ in range(per_round):
                await stream.append(RecordBatch(payload(stream.stream_id, stream.next_offset)))
        first = streams[0]
        await first.close()
        streams[0] = await client.streams.open_stream(first.stream_id, epoch=first.epoch + 1)
    return streams


async def test_a_read_replans_from_fresh_metadata_when_compaction_deleted_its_objects(tmp_path: Path) -> None:
    data = tmp_path / "data"
    config = FAST.replace(wal_upload_interval_ms=60_000)
    client = await s3stream.open(data, config=config)
    try:
        streams = [await client.streams.create_and_open_stream() for _ in range(2)]
        streams = await fill_by_close(client, streams, rounds=4, per_round=12)
        old = {o.object_id for o in await client.engine.metadata.list_objects([ObjectState.COMMITTED])}
        assert len(old) == 4
        metadata = await ReadOnlySqliteStore.open(data / "metadata.db")
        storage = LocalObjectStorage(str(data / "objects"))
        # Without readahead the window's later blocks are not loaded ahead: the next read must GET them.
        object_reader = ObjectStreamReader(
            metadata,
            storage,
            namespace=FAST.namespace,
            block_cache=BlockCache(FAST.block_cache_size_bytes),
            reader_cache=ObjectReaderCache(storage, capacity_bytes=1 << 20),
            readahead=ReadaheadSettings(enabled=False),
        )
        async with Reader(metadata, object_reader, closers=[storage.close, metadata.close]) as reader:
            stream = streams[0]
            end = stream.next_offset
            head = await reader.fetch(stream.stream_id, 0, end, max_bytes=1)
            planned = {ref.object_id for state in object_reader._states.values() for ref in state.window}
            assert len(planned) >= 2
            report = await client.components["compactor"].run_once()
            assert report.stream_set_objects_written >= 1
            # The objects the reader planned its next read on are gone from metadata and the bucket.
            live = {o.object_id for o in await client.engine.metadata.list_objects()}
            assert not planned & live
            keys = {info.key async for info in storage.list("")}
            assert len(keys) == len(live)
            tail = await reader.fetch(stream.stream_id, head[-1].end_offset, end, max_bytes=1 << 30)
            assert reader.stats().retry_count >= 1
            want = await stream.fetch(0, end, 1 << 30)
            assert rows(head + tail) == rows(want)
    finally:
        await client.close()


def test_open_reader_sync_reads_like_the_async_reader(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with s3stream.open_sync(data, config=small_config()) as client:
        stream = client.streams.create_and_open_stream()
        for i in range(5):
            stream.append(RecordBatch(f"r{i}".encode()))
        stream.close()
    with s3stream.open_reader_sync(**urls(data)) as reader:
        assert [m.end_offset for m in reader.list_streams()] == [5]
        assert [bytes(b.payload) for b in reader.fetch(stream.stream_id, 0, 5)] == [
            f"r{i}".encode() for i in range(5)
        ]
    with pytest.raises(ClosedError):
        reader.fetch(stream.stream_id, 0, 5)


async def test_the_storage_recorded_in_the_metadata_is_used_when_no_bucket_uri_is_given(
    tmp_path: Path,
) -> None:
    data, bucket = tmp_path / "data", tmp_path / "bucket"
    client = await s3stream.open(data, bucket_uri=f"file://{bucket}", config=small_config())
    stream = await client.streams.create_and_open_stream()
    await stream.append(RecordBatch(b"x"))
    await client.close()
    metadata_url = f"sqlite://{data / 'metadata.db'}"
    async with await s3stream.open_reader(metadata_url=metadata_url) as reader:
        assert rows(await reader.fetch(stream.stream_id, 0, 1)) == [(0, 1, b"x")]
    with pytest.raises(ConflictError):
        await s3stream.open_reader(metadata_url=metadata_url, bucket_uri=f"file://{tmp_path / 'other'}")
    with pytest.raises(ConflictError):
        await s3stream.open_reader(metadata_url=metadata_url, config=small_config(namespace="other"))
    local = tmp_path / "local"
    await (await s3stream.open(local, config=small_config())).close()
    with pytest.raises(InvalidArgumentError, match="objects/ folder"):
        await s3stream.open_reader(metadata_url=f"sqlite://{local / 'metadata.db'}")


async def test_bad_arguments_are_invalid_argument_errors(tmp_path: Path) -> None:
    data = tmp_path / "data"
    client = await s3stream.open(data, config=small_config())
    stream = await client.streams.create_and_open_stream()
    await stream.append(RecordBatch(b"x"))
    await stream.close()
    await client.close()
    for kwargs in [
        {"metadata_url": "mysql://x/y"},
        {"metadata_url": ""},
        {"metadata_url": "sqlite:///"},
        {**urls(data), "config": {"s3.namespace": "x"}},
        {**urls(data), "bucket_uri": ""},
        {**urls(data), "bucket_uri": "ftp://nowhere"},
    ]:
        with pytest.raises(InvalidArgumentError):
            await s3stream.open_reader(**kwargs)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="metadata URL"):
        await s3stream.open_reader(bucket_uri=urls(data)["bucket_uri"], config=Config())
    with pytest.raises(NotFoundError):
        await s3stream.open_reader(metadata_url=f"sqlite://{tmp_path / 'none.db'}")
    (tmp_path / "junk.db").write_bytes(b"not a database at all" * 100)
    with pytest.raises(s3stream.CorruptionError):
        await s3stream.open_reader(metadata_url=f"sqlite://{tmp_path / 'junk.db'}")
    async with await s3stream.open_reader(**urls(data)) as reader:
        sid = stream.stream_id
        for args in [
            ("1", 0, 1, 10),
            (True, 0, 1, 10),
            (-1, 0, 1, 10),
            (sid, -1, 1, 10),
            (sid, 0, 1.5, 10),
            (sid, 1, 0, 10),
            (sid, 0, 1, 0),
            (sid, 0, 1, None),
        ]:
            with pytest.raises(InvalidArgumentError):
                await reader.fetch(*args)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError):
            await reader.describe_stream("1")  # type: ignore[arg-type]
    with pytest.raises(ClosedError):
        await reader.list_streams()


async def test_a_reader_reads_streams_whose_metadata_is_on_postgresql(tmp_path: Path, pg_url: str) -> None:
    metadata = cast(MetadataStore, await open_metadata_store(pg_url))
    bucket = f"file://{tmp_path / 'bucket'}"
    client = await s3stream.open(tmp_path / "data", bucket_uri=bucket, config=FAST, metadata=metadata)
    try:
        stream = await client.streams.create_and_open_stream()
        await fill(client, [stream], rounds=2, per_round=10)
        async with await s3stream.open_reader(metadata_url=pg_url, config=FAST) as reader:  # bucket recorded
            assert [m.end_offset for m in await reader.list_streams()] == [stream.next_offset]
            end = stream.next_offset
            got = await reader.fetch(stream.stream_id, 0, end, 1 << 20)
            assert rows(got) == rows(await stream.fetch(0, end, 1 << 20))
    finally:
        await client.close()
