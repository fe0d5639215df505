"""S3 upload memory on a real S3 server: an upload holds at most (part_concurrency_max + 1) parts plus
one page of written bytes, never pins the caller's buffer, and its bodies reach the wire uncopied."""

from __future__ import annotations

import gc
import hashlib
import tracemalloc
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from s3stream.storage.base import MIN_PART_SIZE_BYTES
from s3stream.storage.retry import RetryPolicy
from s3stream.storage.s3 import S3ObjectStorage
from s3stream.storage.s3upload import PAGE_BYTES
from s3stream.storage.uri import parse_bucket_uri, s3_config_from_uri
from tests.conftest import S3TestServer

pytestmark = pytest.mark.integration

MiB = 1024 * 1024
PART_BYTES = MIN_PART_SIZE_BYTES
SLACK_BYTES = 3 * MiB
"""Transient, per request: botocore hashes the body in 1 MiB reads (two alive at once), aiohttp's
first chunk joined with the headers, the response objects."""


@pytest.fixture
async def lean(s3_server: S3TestServer, s3_prefix: str) -> AsyncIterator[S3ObjectStorage]:
    config = replace(
        s3_config_from_uri(parse_bucket_uri(s3_server.uri(s3_prefix))),
        part_size_bytes=PART_BYTES,
        part_concurrency_max=1,
        retry=RetryPolicy(deadline_s=60, attempt_timeout_s=30),
    )
    store = S3ObjectStorage(config)
    await store.put("warm", b"x")  # client creation and botocore's models are not the upload's
    yield store
    await store.delete([info.key async for info in store.list()])
    await store.close()


async def _peak_bytes_of(step: object) -> int:
    gc.collect()
    tracemalloc.start()
    try:
        floor, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        await step  # type: ignore[misc]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak - floor


async def test_streamed_upload_holds_at_most_two_parts(lean: S3ObjectStorage) -> None:
    """40 MiB written from one reused mutable buffer: peak far below the object, within the bound,
    and the object is what was written (the upload copied each write, it did not keep the buffer)."""
    chunk = bytearray(256 * 1024)
    digest = hashlib.sha256()

    async def stream() -> None:
        upload = lean.upload("big")
        for i in range(160):
            chunk[:] = i.to_bytes(1, "little") * len(chunk)
            digest.update(chunk)
            await upload.write(memoryview(chunk))
        assert await upload.complete() == 160 * len(chunk)

    peak = await _peak_bytes_of(stream())
    assert peak <= 2 * PART_BYTES + PAGE_BYTES + SLACK_BYTES, peak / MiB
    assert lean.stats.counts["upload_part"] == 8
    assert lean.stats.counts.get("put", 0) == 1  # the warm-up only: multipart from the first full part
    assert hashlib.sha256(await lean.get("big")).digest() == digest.digest()


async def test_views_of_a_large_buffer_do_not_pin_it(lean: S3ObjectStorage) -> None:
    """Small views of a big immutable buffer are copied: dropping the buffer frees it mid-upload."""
    gc.collect()
    tracemalloc.start()
    try:
        big = bytes(range(256)) * (64 * 1024)  # 16 MiB
        upload = lean.upload("small")
        await upload.write(memoryview(big)[:1000])
        before, _ = tracemalloc.get_traced_memory()
        del big
        gc.collect()
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert before - after >= 15 * MiB  # tracked allocation of the buffer itself went away
    await upload.complete()
    assert await lean.get("small") == bytes(range(256)) * 3 + bytes(range(232))


async def test_single_put_body_is_not_copied(lean: S3ObjectStorage) -> None:
    """A 4 MiB object (staged, one PUT): the upload's one copy of the data and nothing per send."""
    data = bytearray(b"\x5a" * (4 * MiB))

    async def put_once() -> None:
        upload = lean.upload("one")
        await upload.write(data)
        await upload.complete()

    peak = await _peak_bytes_of(put_once())
    assert peak <= 4 * MiB + SLACK_BYTES, peak / MiB
    assert await lean.get("one") == data
