"""Several buckets with the metadata on PostgreSQL: a node writes over two buckets (placement rows in
the shared schema), a reader in the same process reads every record through the recorded placement,
and a bucket emptied by hand under replication costs nothing."""

from __future__ import annotations

from pathlib import Path

from s3stream.assembly import open_client, open_reader
from s3stream.storage.local import LocalObjectStorage
from tests.support.buckets_e2e import CONFIG, ingest, read_all


async def test_a_reader_on_postgresql_reads_objects_placed_over_two_buckets(
    tmp_path: Path, pg_url: str
) -> None:
    buckets = f"0@file://{tmp_path}/b0,1@file://{tmp_path}/b1"
    config = CONFIG.replace(metadata_url=pg_url, data_buckets_strategy="replication")
    client = await open_client(tmp_path / "node", bucket_uri=buckets, config=config)
    try:
        stream = await client.streams.create_and_open_stream()
        await ingest(client, [stream], 3)
        records = await read_all(stream)
        usage = await client.engine.metadata.bucket_usage()
        assert set(usage) == {0, 1}
        assert usage[0] == usage[1]
    finally:
        await client.close()
    emptied = LocalObjectStorage(str(tmp_path / "b0"))
    await emptied.delete([info.key async for info in emptied.list("")])
    await emptied.close()
    reader = await open_reader(metadata_url=pg_url, config=config)  # the recorded bucket list
    try:
        got = await reader.fetch(stream.stream_id, 0, len(records), max_bytes=64 << 20)
        assert [(b.base_offset, b.payload) for b in got] == records
    finally:
        await reader.close()
