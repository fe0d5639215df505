"""A writer process for the metadata-copy crash tests: ``python -m tests.support.metacopy_child DIR URI``.

Phase 1 writes 8 streams over several uploads, KV pairs, a trim and a compaction, then prints one
JSON line ``{"ready": ...}``. Phase 2 appends, uploads and puts KV pairs for ever, printing one JSON
line per acknowledged fact (``{"uploaded": [stream, end offset]}`` after an upload that covers it,
``{"kv": [key, value]}`` after a put returned) until it is killed.
"""

from __future__ import annotations

import asyncio
import json
import sys

import s3stream
from compaction.compactor import Compactor
from s3stream import Config, RecordBatch

CONFIG = Config(wal_capacity_bytes=16 << 20, wal_record_max_bytes=1 << 20, record_max_bytes=1 << 20)
STREAMS = 8


def payload(stream_id: int, offset: int) -> bytes:
    """The record at ``offset`` of ``stream_id``: derived from both, so a read back can be checked."""
    return f"s{stream_id}o{offset};".encode() * (1 + offset % 13)


def say(fact: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(fact) + "\n")
    sys.stdout.flush()


async def main(data_dir: str, bucket_uri: str) -> None:
    client = await s3stream.open(data_dir, bucket_uri=bucket_uri, config=CONFIG)
    streams = [await client.streams.create_and_open_stream() for _ in range(STREAMS)]
    for _ in range(3):
        for stream in streams:
            for _ in range(25):
                await stream.append(RecordBatch(payload(stream.stream_id, stream.next_offset)))
        await client.engine.force_upload(None)
    for i in range(10):
        await client.kv.put(f"ready-{i}", b"value-%d" % i)
    await client.kv.delete("ready-3")
    await streams[0].trim(30)
    engine = client.engine
    compactor = Compactor(
        client.config, engine.metadata, engine.storage, node_id=engine.node_id, node_epoch=engine.node_epoch
    )
    report = await compactor.run_once(stream_objects=True)
    say(
        {
            "ready": {
                "compacted": report.stream_set_objects_compacted,
                "ends": {s.stream_id: s.next_offset for s in streams},
            }
        }
    )
    i = 0
    while True:
        stream = streams[i % STREAMS]
        await stream.append(RecordBatch(payload(stream.stream_id, stream.next_offset)))
        if i % 16 == 15:
            ends = {s.stream_id: s.next_offset for s in streams}
            await client.engine.force_upload(None)
            for sid, end in ends.items():
                say({"uploaded": [sid, end]})
        if i % 5 == 0:
            key, value = f"live-{i}", b"v%d" % i
            await client.kv.put(key, value)
            say({"kv": [key, value.decode()]})
        i += 1


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
