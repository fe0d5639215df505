"""Small responses from the real S3 server come without the delayed-ACK stall (quick ACKs on the
client's connections, s3stream.storage.s3quickack): an object's index is read in one small GET."""

from __future__ import annotations

import statistics
import time
from collections.abc import AsyncIterator

import pytest

from s3stream.storage.s3 import S3ObjectStorage
from s3stream.storage.uri import parse_bucket_uri, s3_config_from_uri
from tests.support.s3 import S3TestServer

pytestmark = pytest.mark.integration

GETS = 15
STALL_S = 0.030
"""Linux delays an ACK ~40 ms: a median at or above this is the stall, not the server's work."""


@pytest.fixture
async def storage(s3_server: S3TestServer, s3_prefix: str) -> AsyncIterator[S3ObjectStorage]:
    store = S3ObjectStorage(s3_config_from_uri(parse_bucket_uri(s3_server.uri(s3_prefix))))
    yield store
    await store.delete(["small"])
    await store.close()


async def test_small_gets_and_heads_take_no_delayed_ack_stall(storage: S3ObjectStorage) -> None:
    await storage.put("small", b"i" * 8192)
    await storage.get("small", 0, 100)  # the connection is open and warm
    gets: list[float] = []
    heads: list[float] = []
    for _ in range(GETS):  # one after another on a keep-alive connection, as a reader opens objects
        started = time.perf_counter()
        assert len(await storage.get("small", 0, 8192)) == 8192
        gets.append(time.perf_counter() - started)
        started = time.perf_counter()
        assert (await storage.head("small")).size_bytes == 8192
        heads.append(time.perf_counter() - started)
    assert statistics.median(gets) < STALL_S, [round(t * 1000, 1) for t in gets]
    assert statistics.median(heads) < STALL_S, [round(t * 1000, 1) for t in heads]
