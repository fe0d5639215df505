"""A reader in another process reads every uploaded record, byte-exact, from Ceph RGW while a writer
appends and compaction replaces (and deletes) the objects under it."""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

import s3stream
from s3stream import RecordBatch, Stream
from tests.integration.remote_reader_proc import expected_payload
from tests.support.configs import KiB, small_config
from tests.support.s3 import S3TestServer

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]

CONFIG = small_config(
    wal_upload_interval_ms=100,  # what the reader can see lags the writer by about this much
    object_block_size_bytes=16 * KiB,
    object_delete_retention_minutes=0,  # compaction's replaced objects are deleted at once
    stream_set_object_compaction_interval_minutes=1_000,  # compaction runs when the test says
)


async def write(stream: Stream, batch_count: int, digest: hashlib._Hash) -> None:
    for _ in range(batch_count):
        offset = stream.next_offset
        count = 1 + offset % 3
        body = expected_payload(stream.stream_id, offset, count)
        await stream.append(RecordBatch(body, count=count))
        digest.update(body)
        if offset % 8 == 0:
            await asyncio.sleep(0.04)  # spread the appends over many uploads


async def test_a_reader_in_another_process_reads_everything_uploaded_during_compaction(
    s3_server: S3TestServer, s3_prefix: str, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    client = await s3stream.open(data, bucket_uri=s3_server.uri(s3_prefix), config=CONFIG)
    stop_file = tmp_path / "stop"
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": s3_server.access_key,
        "AWS_SECRET_ACCESS_KEY": s3_server.secret_key,
    }
    reader = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.integration.remote_reader_proc",
            f"sqlite://{data / 'metadata.db'}",
            str(stop_file),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    digests = {}
    compactions = 0
    try:
        assert reader.stdout is not None
        assert reader.stdout.readline() == "READY\n"
        streams = [await client.streams.create_and_open_stream() for _ in range(3)]
        digests = {s.stream_id: hashlib.sha256() for s in streams}
        writers = asyncio.gather(*(write(s, 400, digests[s.stream_id]) for s in streams))
        compactor = client.components["compactor"]
        while not writers.done():
            await asyncio.sleep(0.4)
            report = await compactor.run_once()
            compactions += report.stream_set_objects_written
        await writers
        ends = {s.stream_id: s.next_offset for s in streams}
        for stream in streams:
            await stream.close()  # uploads the rest
        compactions += (await compactor.run_once()).stream_set_objects_written
    finally:
        stop_file.touch()
        out, err = reader.communicate(timeout=300)
        await client.close()
    assert reader.returncode == 0, out[-2000:] + err[-3000:]
    lines = out.split("\n")[:-1]
    ended = {int(p[1]): (int(p[2]), p[3]) for p in (line.split() for line in lines) if p[0] == "END"}
    assert ended == {sid: (ends[sid], digests[sid].hexdigest()) for sid in ends}
    assert compactions >= 2  # objects were replaced (and deleted) while the reader read
    stats = next(line.split() for line in lines if line.startswith("STATS"))
    assert int(stats[1]) >= 5  # it read while the writer ran, not only at the end
