"""One node of the shared-KV tests: its own data dir (WAL), a shared SQLite metadata file and bucket.

Usage: python -m tests.crash.kv_node DATA_DIR SHARED_DIR NODE_ID ACTION KEY [VALUE]
ACTION: ``put-hold`` (append one batch to a new stream, which stays in the WAL, put KEY=VALUE, print
``PUT``, then wait to be killed), ``put`` (put KEY=VALUE, print ``PUT``, close), ``get`` (print
``GET <value>`` or ``GET -`` for no value, and ``REPLAYED <n>`` with the batches the open replayed, close).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from s3stream import RecordBatch
from s3stream.assembly import open_client
from s3stream.config import Config
from s3stream.metadata.sqlite import SqliteMetadataStore
from s3stream.storage.local import LocalObjectStorage

CONFIG = Config(
    wal_capacity_bytes=4 << 20,
    wal_record_max_bytes=1 << 20,
    record_max_bytes=1 << 20,
    wal_upload_interval_ms=3_600_000,  # the appended batch stays in the WAL (and keeps it untrimmed)
)


async def main(argv: list[str]) -> None:
    data_dir, shared = Path(argv[0]), Path(argv[1])
    node_id, action, key = int(argv[2]), argv[3], argv[4]
    metadata = await SqliteMetadataStore.open(str(shared / "metadata.db"))
    storage = LocalObjectStorage(str(shared / "objects"))
    client = await open_client(
        data_dir, config=CONFIG.replace(node_id=node_id), metadata=metadata, storage=storage
    )
    if action == "put-hold":
        stream = await client.streams.create_and_open_stream()
        await stream.append(RecordBatch(b"held in the WAL"))
        await client.kv.put(key, argv[5].encode())
        print("PUT", flush=True)
        await asyncio.sleep(3600)
    elif action == "put":
        await client.kv.put(key, argv[5].encode())
        print("PUT", flush=True)
    elif action == "get":
        value = await client.kv.get(key)
        print("GET " + ("-" if value is None else value.decode()), flush=True)
        print(f"REPLAYED {client.engine.stats.recovered_records}", flush=True)
    await client.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
