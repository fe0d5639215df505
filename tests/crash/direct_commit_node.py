"""One engine process of the external-commit KV crash test: WAL KV puts and external commits interleaved.

Usage: python -m tests.crash.direct_commit_node DATA_DIR ACTION
ACTION ``commit-hold``: on a new stream, alternate WAL appends and WAL KV puts of ``k`` with external
commits (objects written by ``s3stream.direct.writer``) that put ``direct/progress``; leave WAL data and
KV records untrimmed, print ``READY``, then wait to be killed. ``check``: open (replaying the WAL), print
``REPLAYED <n>``, ``KV <k> <direct/progress>``, and one ``BATCH <offset> <payload>`` line per batch.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from s3stream import RecordBatch
from s3stream.assembly import open_client
from s3stream.config import Config
from s3stream.direct.writer import write_object
from s3stream.engine.client import Client, Stream
from s3stream.engine.kvlog import DIRECT_KV_PREFIX
from s3stream.errors import InvalidArgumentError

CONFIG = Config(
    wal_capacity_bytes=8 << 20,
    wal_record_max_bytes=1 << 20,
    record_max_bytes=1 << 20,
    wal_upload_interval_ms=3_600_000,  # appended batches stay in the WAL until a commit forces them up
    wal_upload_threshold_bytes=4 << 20,
)
PROGRESS = DIRECT_KV_PREFIX + "crash/progress"


async def external(client: Client, uri: str, stream: Stream, count: int, progress: int) -> None:
    object_id = await client.prepare_objects(1)
    start = stream.next_offset
    records = [
        (stream.stream_id, stream.epoch, o, 1, f"ext-{o}".encode()) for o in range(start, start + count)
    ]
    info = await asyncio.to_thread(write_object, uri, client.config.namespace, object_id, records)
    expected = None if progress == 1 else str(progress - 1).encode()
    await client.commit_objects(
        [stream],
        [info.committed()],
        kv_puts={PROGRESS: str(progress).encode()},
        kv_expect={PROGRESS: expected},
    )


async def wal(client: Client, stream: Stream, count: int, value: str) -> None:
    for _ in range(count):
        await stream.append(RecordBatch(f"wal-{stream.next_offset}".encode()))
    await client.kv.put("k", value.encode())


async def main(data_dir: Path, action: str) -> None:
    uri = (data_dir / "objects").absolute().as_uri()
    client = await open_client(data_dir, bucket_uri=uri, config=CONFIG)
    if action == "commit-hold":
        stream = await client.streams.create_and_open_stream()
        await wal(client, stream, 3, "wal-1")
        try:
            await client.kv.put(PROGRESS, b"0")  # the WAL must never hold a direct key
        except InvalidArgumentError:
            pass
        else:
            raise SystemExit("a WAL put of a direct key was accepted")
        await external(client, uri, stream, 3, progress=1)
        await wal(client, stream, 2, "wal-2")
        await external(client, uri, stream, 4, progress=2)
        await wal(client, stream, 2, "wal-3")  # WAL KV record and batches left untrimmed by the kill
        print("READY", flush=True)
        await asyncio.sleep(3600)
    stream = await client.streams.open_stream((await client.streams.list_streams())[0].stream_id, epoch=1)
    print("REPLAYED", client.engine.stats.recovered_records, flush=True)
    k, progress = await client.kv.get("k"), await client.kv.get(PROGRESS)
    print("KV", k.decode() if k else "-", progress.decode() if progress else "-", flush=True)
    offset = 0
    while offset < stream.confirm_offset:
        for batch in await stream.fetch(offset, stream.confirm_offset, max_bytes=1 << 20):
            print("BATCH", batch.base_offset, bytes(batch.payload).decode(), flush=True)
            offset = batch.base_offset + batch.count
    await client.close()


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), sys.argv[2]))
