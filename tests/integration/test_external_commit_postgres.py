"""An external commit on a live engine whose metadata is PostgreSQL (objects in a local directory): the
held WAL data goes up first, the commit and its KV land in one transaction, and a restart reads every
batch of both paths in offset order."""

from __future__ import annotations

import asyncio
from pathlib import Path

from s3stream import RecordBatch
from s3stream.assembly import open_client
from s3stream.direct.writer import write_object
from s3stream.engine.client import Stream
from s3stream.engine.kvlog import DIRECT_KV_PREFIX
from s3stream.metadata.postgres import PostgresMetadataStore
from tests.integration.test_external_commit_s3 import CONFIG

PROGRESS = DIRECT_KV_PREFIX + "pg/progress"


async def read_all(stream: Stream) -> list[bytes]:
    out: list[bytes] = []
    while len(out) < stream.confirm_offset:
        out += [bytes(b.payload) for b in await stream.fetch(len(out), stream.confirm_offset)]
    return out


async def test_an_external_commit_on_postgresql_metadata(tmp_path: Path, pg_url: str) -> None:
    uri = (tmp_path / "objects").absolute().as_uri()
    metadata = await PostgresMetadataStore.open(pg_url)
    client = await open_client(tmp_path / "data", bucket_uri=uri, config=CONFIG, metadata=metadata)
    stream = await client.streams.create_and_open_stream()
    for o in range(3):
        await stream.append(RecordBatch(b"wal-%d" % o))
    first = await client.prepare_objects(1)
    records = [(stream.stream_id, stream.epoch, o, 1, b"ext-%d" % o) for o in range(3, 7)]
    info = await asyncio.to_thread(write_object, uri, client.config.namespace, first, records)
    await client.commit_objects([stream], [info.committed(stream_object=True)], kv_puts={PROGRESS: b"1"})
    await stream.append(RecordBatch(b"wal-7"))
    expected = [b"wal-0", b"wal-1", b"wal-2", b"ext-3", b"ext-4", b"ext-5", b"ext-6", b"wal-7"]
    assert await read_all(stream) == expected
    stream_id = stream.stream_id
    await client.close()
    await metadata.close()

    metadata = await PostgresMetadataStore.open(pg_url)
    again = await open_client(tmp_path / "data", bucket_uri=uri, config=CONFIG, metadata=metadata)
    reopened = await again.streams.open_stream(stream_id, epoch=1)
    assert await read_all(reopened) == expected
    assert await again.kv.get(PROGRESS) == b"1"
    await again.close()
    await metadata.close()
