"""S3 upload memory on a real S3 server: an upload holds at most (part_concurrency_max + 1) parts plus
one page of written bytes, never pins the caller's buffer, and its bodies reach the wire uncopied;
given ``buffer_max_bytes``, an upload with the default settings stays within that limit."""

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
from tests.support.s3 import S3TestServer

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


# -- buffer_max_bytes with the default S3 settings (16 MiB parts, 4 in flight, 32 MiB single PUT) ------


@pytest.fixture
async def defaults(s3_server: S3TestServer, s3_prefix: str) -> AsyncIterator[S3ObjectStorage]:
    config = replace(
        s3_config_from_uri(parse_bucket_uri(s3_server.uri(s3_prefix))),
        retry=RetryPolicy(deadline_s=60, attempt_timeout_s=30),
    )
    assert (config.part_concurrency_max + 1) * config.part_size_bytes >= 80 * MiB  # the unbounded shape
    store = S3ObjectStorage(config)
    await store.put("warm", b"x")
    yield store
    await store.delete([info.key async for info in store.list()])
    await store.close()


@pytest.mark.parametrize(
    ("buffer_max_bytes", "parts"),
    [(12 * MiB, 7), (7 * MiB, 6)],  # 6 MiB parts, one in flight; 7 MiB parts sent inline
)
async def test_a_buffer_limit_bounds_a_default_upload(
    defaults: S3ObjectStorage, buffer_max_bytes: int, parts: int
) -> None:
    """40 MiB streamed with the default settings but a limit far below their 80 MiB: the peak stays
    within the limit (plus the same page and per-request allowance as the two-part test above), and
    the object is what was written."""
    chunk = bytearray(256 * 1024)
    digest = hashlib.sha256()

    async def stream() -> None:
        upload = defaults.upload("bounded", buffer_max_bytes=buffer_max_bytes)
        for i in range(160):
            chunk[:] = (i % 251).to_bytes(1, "little") * len(chunk)
            digest.update(chunk)
            await upload.write(memoryview(chunk))
        assert await upload.complete() == 160 * len(chunk)

    peak = await _peak_bytes_of(stream())
    assert peak <= buffer_max_bytes + PAGE_BYTES + SLACK_BYTES, peak / MiB
    assert defaults.stats.counts["upload_part"] == parts
    assert hashlib.sha256(await defaults.get("bounded")).digest() == digest.digest()


async def test_a_buffer_limit_bounds_staged_copies(defaults: S3ObjectStorage) -> None:
    """Small copies are staged and range-read at complete: a limit of 12 MiB caps the staged body at
    one 6 MiB part, so 20 MiB of small copies go multipart instead of one 20 MiB PUT body."""
    source = bytes(range(256)) * (4 * 4096)  # 4 MiB
    await defaults.put("src", source)
    del source
    expected = hashlib.sha256()

    async def copy_many() -> None:
        upload = defaults.upload("copied", buffer_max_bytes=12 * MiB)
        for i in range(5):
            start = i * 1000
            await upload.copy("src", start, start + 4 * MiB - 5000)
        assert await upload.complete() == 5 * (4 * MiB - 5000)

    for i in range(5):
        start = i * 1000
        expected.update((bytes(range(256)) * (4 * 4096))[start : start + 4 * MiB - 5000])
    peak = await _peak_bytes_of(copy_many())
    assert peak <= 12 * MiB + PAGE_BYTES + SLACK_BYTES, peak / MiB
    assert defaults.stats.counts["create_multipart"] == 1
    assert hashlib.sha256(await defaults.get("copied")).digest() == expected.digest()
