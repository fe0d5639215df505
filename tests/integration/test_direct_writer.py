"""Direct writes on a real S3 server (Ceph RGW): write_object publishes one readable AutoMQ-format object,
create-only for single PUTs and multipart uploads alike, and publishes nothing on a bad input."""

from __future__ import annotations

import asyncio
import os

import pytest

from s3stream.direct.writer import PART_SIZE_BYTES, write_object
from s3stream.errors import ConflictError, InvalidArgumentError, NotFoundError
from s3stream.ids import StreamId
from s3stream.metadata.base import StreamOffsetRange
from s3stream.objectformat.keys import object_key
from s3stream.objectformat.reader import ObjectReader
from s3stream.objectformat.writer import RecordFields
from tests.support.s3 import S3TestServer

NS = "direct"


def batches(stream_id: int, start: int, count: int, size: int = 100) -> list[RecordFields]:
    """``count`` batches of 2 records each from offset ``start``; payload bytes name the offset."""
    return [
        (stream_id, 3, start + 2 * i, 2, f"{stream_id}:{start + 2 * i}:".encode().ljust(size, b"x"))
        for i in range(count)
    ]


async def read_back(
    server: S3TestServer, prefix: str, key: str, size: int, stream_id: int
) -> list[tuple[int, int, bytes]]:
    storage = server.storage(prefix)
    try:
        reader = await ObjectReader.open(storage, key, size)
        found = reader.find(stream_id, 0)
        blocks = await reader.read_blocks(found.entries)
        return [(r.base_offset, r.count, r.payload) for block in blocks for r in block.records]
    finally:
        await storage.close()


async def exists(server: S3TestServer, prefix: str, key: str) -> bool:
    storage = server.storage(prefix)
    try:
        await storage.head(key)
        return True
    except NotFoundError:
        return False
    finally:
        await storage.close()


def test_an_object_of_two_streams_is_written_and_reads_back(s3_server: S3TestServer, s3_prefix: str) -> None:
    uri = s3_server.uri(s3_prefix)
    records = batches(4, 100, 50) + batches(9, 0, 30)
    info = write_object(uri, NS, 17, records, block_size_bytes=4096)
    assert info.key == object_key(17, NS)
    assert [(r.stream_id, r.start_offset, r.end_offset) for r in info.ranges] == [(4, 100, 200), (9, 0, 60)]
    assert info.ranges[0].size_bytes == 50 * 100
    assert info.committed(stream_object=False).ranges == info.ranges
    with pytest.raises(InvalidArgumentError):
        info.committed(stream_object=True)
    got = asyncio.run(read_back(s3_server, s3_prefix, info.key, info.size_bytes, 9))
    assert got == [(b, c, p) for _, _, b, c, p in records[50:]]


@pytest.mark.parametrize("count", [20, 3 * PART_SIZE_BYTES // 4096 + 7], ids=["single PUT", "multipart"])
def test_a_second_write_of_the_same_id_is_refused_and_changes_nothing(
    s3_server: S3TestServer, s3_prefix: str, count: int
) -> None:
    uri = s3_server.uri(s3_prefix)
    first = write_object(uri, NS, 5, batches(1, 0, count, size=4096))
    with pytest.raises(ConflictError):
        write_object(uri, NS, 5, batches(1, 0, count, size=4000))
    got = asyncio.run(read_back(s3_server, s3_prefix, first.key, first.size_bytes, 1))
    assert len(got) == count
    assert all(len(p) == 4096 for _, _, p in got)


def test_batches_out_of_order_publish_nothing(s3_server: S3TestServer, s3_prefix: str) -> None:
    uri = s3_server.uri(s3_prefix)
    with pytest.raises(InvalidArgumentError):
        write_object(uri, NS, 6, batches(2, 0, 5) + batches(1, 0, 5))
    with pytest.raises(InvalidArgumentError):
        write_object(uri, NS, 6, batches(2, 0, 5) + batches(2, 12, 5))  # a gap in stream 2
    with pytest.raises(InvalidArgumentError):
        write_object(uri, NS, 6, [])
    assert not asyncio.run(exists(s3_server, s3_prefix, object_key(6, NS)))
    # the id is still free for a good attempt
    assert write_object(uri, NS, 6, batches(2, 0, 5)).ranges == (StreamOffsetRange(StreamId(2), 0, 10, 500),)


def test_a_forked_child_writes_with_its_own_worker(s3_server: S3TestServer, s3_prefix: str) -> None:
    uri = s3_server.uri(s3_prefix)
    write_object(uri, NS, 30, batches(1, 0, 3))  # the parent's worker exists before the fork
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit status
        try:
            write_object(uri, NS, 31, batches(1, 0, 3))
            os._exit(0)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert asyncio.run(exists(s3_server, s3_prefix, object_key(31, NS)))
