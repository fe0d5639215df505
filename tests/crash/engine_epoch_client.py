"""One node of the cross-process fencing test: its own WAL, a shared SQLite metadata file and bucket.

Usage: python -m tests.crash.engine_epoch_client WAL_DIR SHARED_DIR NODE_ID STREAM_ID EPOCH ACTION
ACTION: ``append-close`` (open, append one batch, close), ``append-hold`` (open, append, print HELD,
wait for stdin to close, then append again), ``append-many`` (open, append batches of a tag ``node<N>:<task>.<i>`` repeated
50 times from 32 tasks, printing ``OK <offset> <tag>`` for each acknowledged one, until killed), ``read``
(open, print ``R <offset> <payload>`` for every record from the start, close). Prints ``OK <offset>`` or
``ERR <ErrorKind>`` lines.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
from pathlib import Path

from s3stream import RecordBatch, S3StreamError
from s3stream.assembly import open_client
from s3stream.config import Config
from s3stream.engine.client import Stream
from s3stream.metadata.sqlite import SqliteMetadataStore
from s3stream.storage.local import LocalObjectStorage

CONFIG = Config(wal_capacity_bytes=4 << 20, wal_record_max_bytes=1 << 20, record_max_bytes=1 << 20)


async def append_until_killed(stream: Stream, node_id: int) -> None:
    async def task(t: int) -> None:
        for i in itertools.count():
            tag = f"node{node_id}:{t}.{i}"
            offset = await stream.append(RecordBatch(tag.encode() * 50))
            print(f"OK {offset} {tag}", flush=True)

    await asyncio.gather(*(task(t) for t in range(32)))


async def main(argv: list[str]) -> None:
    wal_dir, shared = Path(argv[0]), Path(argv[1])
    node_id, stream_id, epoch, action = int(argv[2]), int(argv[3]), int(argv[4]), argv[5]
    metadata = await SqliteMetadataStore.open(str(shared / "metadata.db"))
    storage = LocalObjectStorage(str(shared / "objects"))
    client = await open_client(
        wal_dir, config=CONFIG.replace(node_id=node_id), metadata=metadata, storage=storage
    )
    try:
        stream = await client.streams.open_stream(stream_id, epoch=epoch)  # type: ignore[arg-type]
        if action != "read":
            print(f"OK {await stream.append(RecordBatch(f'node{node_id}'.encode()))}", flush=True)
        if action == "read":
            offset = stream.start_offset
            while offset < stream.confirm_offset:
                for batch in await stream.fetch(offset, stream.confirm_offset, max_bytes=1 << 20):
                    print(f"R {batch.base_offset} {batch.payload.decode()}", flush=True)
                    offset = batch.end_offset
            await stream.close()
            return
        if action == "append-many":
            await append_until_killed(stream, node_id)
        if action == "append-hold":
            print("HELD", flush=True)
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
            print(f"OK {await stream.append(RecordBatch(b'late'))}", flush=True)
        await stream.close()
    except S3StreamError as exc:
        print(f"ERR {type(exc).__name__}", flush=True)
    finally:
        await client.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
