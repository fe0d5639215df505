"""A reader in its own process for tests/integration/test_remote_reader_s3.py.

Usage: python -m tests.integration.remote_reader_proc METADATA_URL STOP_FILE
Opens ``s3stream.open_reader(metadata_url=...)`` (the bucket is the one the metadata records, keys from
the environment) and reads every stream from offset 0 to its uploaded end, again and again, checking
each batch against :func:`expected_payload` and that batches continue each other. Once STOP_FILE exists
it does one last pass and prints ``END <stream> <end offset> <sha256 of the payloads in order>`` per
stream and ``STATS <passes that read new batches> <batches> <retries>``; ``READY`` once open. A failed check prints ``ERR <what>`` and exits 1.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import sys

import s3stream
from s3stream.ids import StreamId

FETCH_MAX_BYTES = 64 * 1024


def expected_payload(stream_id: int, base_offset: int, count: int) -> bytes:
    """What the writer appends at ``base_offset`` of ``stream_id`` (sizes vary from 1 byte to 6 KiB)."""
    size = 1 + (base_offset * 7919 + stream_id * 104729) % 6000
    seed = f"{stream_id}:{base_offset}:{count}|".encode()
    return (seed * (size // len(seed) + 1))[:size]


async def main(metadata_url: str, stop_file: str) -> int:
    reader = await s3stream.open_reader(metadata_url=metadata_url)
    next_offset: dict[int, int] = {}
    digests: dict[int, hashlib._Hash] = {}
    passes = batches = 0
    print("READY", flush=True)
    try:
        while True:
            last = os.path.exists(stop_file)
            batches_before = batches
            for meta in await reader.list_streams():
                sid = int(meta.stream_id)
                offset = next_offset.setdefault(sid, 0)
                digest = digests.setdefault(sid, hashlib.sha256())
                while offset < meta.end_offset:
                    got = await reader.fetch(StreamId(sid), offset, meta.end_offset, FETCH_MAX_BYTES)
                    if not got or got[0].base_offset != offset:
                        print(
                            f"ERR stream {sid} at {offset}: got {[b.base_offset for b in got[:3]]}",
                            flush=True,
                        )
                        return 1
                    for batch in got:
                        if batch.base_offset != offset:
                            print(f"ERR stream {sid}: gap or overlap at {offset}", flush=True)
                            return 1
                        if bytes(batch.payload) != expected_payload(sid, batch.base_offset, batch.count):
                            print(f"ERR stream {sid}: wrong payload at {offset}", flush=True)
                            return 1
                        digest.update(bytes(batch.payload))
                        offset = batch.end_offset
                        batches += 1
                next_offset[sid] = offset
            passes += batches > batches_before
            if last:
                break
            await asyncio.sleep(0.05)
        for sid in sorted(next_offset):
            print("END", sid, next_offset[sid], digests[sid].hexdigest(), flush=True)
        stats = reader.stats()
        print("STATS", passes, batches, stats.retry_count, flush=True)
        return 0
    finally:
        await reader.close()


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1], sys.argv[2])))
