"""Crash-test node: appends to the embedded engine with its objects replicated over two buckets,
printing every acknowledgement, until killed.

Usage: python -m tests.crash.bucket_replication_node DATA_DIR BUCKET_LIST RUN STREAMS

The bucket list is ``0@s3://..,1@s3://..`` (``s3.data.buckets``); the strategy is ``replication``.
Prints ``READY`` once open, ``UPLOAD`` when an upload starts writing its object (after prepare),
``WRITTEN`` when every bucket holds it (before the commit), ``COMMITTED`` after the commit, and
``ACK <stream_id> <base_offset>`` per acknowledged append (flushed before the next append). Streams
are created on the first run (ids kept in the KV store); run ``RUN`` opens them with epoch
``2 * RUN`` (each run fences the last; the verifier uses the odd epochs).
"""

from __future__ import annotations

import asyncio
import sys

from s3stream import RecordBatch
from s3stream.assembly import open_client
from s3stream.config import Config
from s3stream.engine.pipeline import UploadObserver
from tests.support.configs import small_config

RECORD_BYTES = 4096
APPEND_PAUSE_S = 0.01
"""Between one stream's appends: about 0.8 MB/s over two streams, near what the throttled bucket takes."""

CONFIG: Config = small_config(
    data_buckets_strategy="replication",
    data_buckets_request_timeout_ms=15_000,
    wal_upload_threshold_bytes=192 << 10,
    wal_upload_interval_ms=200,
    upload_retry_backoff_ms=20,
    upload_retry_backoff_max_ms=200,
    object_prepared_ttl_ms=1500,
    object_delete_retention_minutes=0,
    namespace="bk",
)
"""Objects of about 192 KiB, uploaded often; a short prepared TTL so the reaper may run soon after."""


def payload(stream_id: int, base: int) -> bytes:
    """Deterministic payload: the verifier recomputes it from the stream and offset."""
    head = f"{stream_id}:{base}:".encode()
    return (head * (RECORD_BYTES // len(head) + 1))[:RECORD_BYTES]


class Announcer(UploadObserver):
    async def before_upload(self) -> None:
        print("UPLOAD", flush=True)

    async def before_commit(self) -> None:
        print("WRITTEN", flush=True)

    async def after_commit(self) -> None:
        print("COMMITTED", flush=True)


async def main(argv: list[str]) -> None:
    data_dir, bucket_list, run, streams_count = argv[0], argv[1], int(argv[2]), int(argv[3])
    client = await open_client(data_dir, config=CONFIG, bucket_uri=bucket_list, upload_observer=Announcer())
    ids_blob = await client.kv.get("crash/streams")
    if ids_blob is None:
        ids = [int(await client.streams.create_stream()) for _ in range(streams_count)]
        await client.kv.put("crash/streams", ",".join(map(str, ids)).encode())
    else:
        ids = [int(x) for x in ids_blob.decode().split(",")]
    streams = [await client.streams.open_stream(i, epoch=2 * run) for i in ids]  # type: ignore[arg-type]
    print("READY", flush=True)

    async def producer(index: int) -> None:
        stream = streams[index]
        while True:
            base = stream.next_offset
            got = await stream.append(RecordBatch(payload(stream.stream_id, base)))
            assert got == base
            sys.stdout.write(f"ACK {stream.stream_id} {base}\n")
            sys.stdout.flush()
            await asyncio.sleep(APPEND_PAUSE_S)

    await asyncio.gather(*(producer(i) for i in range(len(streams))))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
