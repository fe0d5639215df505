"""The storage contract on a real S3 server (Ceph RGW in CI), plus S3-only behaviour."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from s3stream.errors import InvalidArgumentError, NotFoundError
from s3stream.storage.base import MIN_PART_SIZE_BYTES
from s3stream.storage.retry import RetryPolicy
from s3stream.storage.s3 import S3Config, S3ObjectStorage
from s3stream.storage.uri import open_storage, parse_bucket_uri, s3_config_from_uri
from tests.support.s3 import S3TestServer
from tests.support.storage_contract import (
    LIST_PAGE_SIZE,
    MULTIPART_THRESHOLD_BYTES,
    MiB,
    StorageContract,
    keys_of,
    payload,
)

pytestmark = pytest.mark.integration


def contract_config(server: S3TestServer, prefix: str) -> S3Config:
    config = s3_config_from_uri(parse_bucket_uri(server.uri(prefix)))
    return replace(
        config,
        multipart_threshold_bytes=MULTIPART_THRESHOLD_BYTES,
        part_size_bytes=MIN_PART_SIZE_BYTES,
        list_page_size=LIST_PAGE_SIZE,
        retry=RetryPolicy(deadline_s=60, attempt_timeout_s=30),
    )


async def wipe(store: S3ObjectStorage) -> None:
    keys = [info.key async for info in store.list()]
    await store.delete(keys)


@pytest.fixture
async def storage(s3_server: S3TestServer, s3_prefix: str) -> AsyncIterator[S3ObjectStorage]:
    store = S3ObjectStorage(contract_config(s3_server, s3_prefix))
    yield store
    await wipe(store)
    await store.close()


class TestS3Contract(StorageContract):
    pass


async def test_multipart_path_is_taken_above_the_threshold(storage: S3ObjectStorage) -> None:
    data = payload(2 * MULTIPART_THRESHOLD_BYTES + 1, seed=11)
    await storage.put("mp", data)
    assert storage.stats.counts["create_multipart"] == 1
    assert storage.stats.counts["upload_part"] == 3  # 5 + 5 + 2 MiB (+1 byte)
    assert storage.stats.counts["complete_multipart"] == 1
    assert await storage.get("mp") == data
    info = await storage.head("mp")
    assert info.size_bytes == len(data)
    assert info.etag  # HEAD gives the real ETag even where Complete's is empty


async def test_large_copies_are_server_side(storage: S3ObjectStorage) -> None:
    source = payload(3 * MIN_PART_SIZE_BYTES, seed=12)
    await storage.put("src", source)
    storage.stats.reset()
    upload = storage.upload("dst")
    await upload.copy("src", 0, MIN_PART_SIZE_BYTES + 7)  # staged, then replayed as UploadPartCopy
    await upload.copy("src", 100, 200)  # small: read into the buffer
    await upload.copy("src", MIN_PART_SIZE_BYTES, 3 * MIN_PART_SIZE_BYTES)  # buffer topped up, rest copied
    await upload.complete()
    expected = source[: MIN_PART_SIZE_BYTES + 7] + source[100:200] + source[MIN_PART_SIZE_BYTES:]
    assert await storage.get("dst") == expected
    assert storage.stats.counts["upload_part_copy"] == 2
    assert storage.stats.bytes["upload_part_copy"] < len(expected)
    assert storage.stats.counts["upload_part"] == 1  # the topped-up 5 MiB buffer


async def test_small_copies_under_the_threshold_become_one_put(storage: S3ObjectStorage) -> None:
    await storage.put("src", b"0123456789" * 1000)
    storage.stats.reset()
    upload = storage.upload("dst")
    await upload.write(b"head")
    await upload.copy("src", 10, 5000)
    await upload.complete()
    assert storage.stats.counts["put"] == 1
    assert storage.stats.counts["create_multipart"] == 0
    assert await storage.get("dst") == b"head" + (b"0123456789" * 1000)[10:5000]


async def test_prefix_isolates_keys(s3_server: S3TestServer, s3_prefix: str) -> None:
    a = S3ObjectStorage(contract_config(s3_server, s3_prefix + "a"))
    b = S3ObjectStorage(contract_config(s3_server, s3_prefix + "b/"))
    try:
        await a.put("k", b"from a")
        await b.put("k", b"from b")
        assert await a.get("k") == b"from a"
        assert await keys_of(b) == ["k"]
        assert a.config.prefix == s3_prefix + "a/"
    finally:
        await wipe(a)
        await wipe(b)
        await a.close()
        await b.close()


async def test_open_storage_from_uri_round_trips(s3_server: S3TestServer, s3_prefix: str) -> None:
    store = open_storage(s3_server.uri(s3_prefix) + "&checksumMode=when_required&apiCallTimeoutMs=20000")
    try:
        await store.put("u", b"via uri")
        assert await store.get("u") == b"via uri"
        await store.delete(["u"])
    finally:
        await store.close()


async def test_wrong_secret_is_a_permanent_configuration_error(
    s3_server: S3TestServer, s3_prefix: str
) -> None:
    config = replace(contract_config(s3_server, s3_prefix), secret_key="wrong-secret")
    store = S3ObjectStorage(config)
    try:
        with pytest.raises(InvalidArgumentError, match="403"):
            await store.put("x", b"1")
        assert store.stats.counts["retry"] == 0
    finally:
        await store.close()


async def test_missing_bucket_is_not_found(s3_server: S3TestServer) -> None:
    config = replace(contract_config(s3_server, ""), bucket="s3stream-no-such-bucket")
    store = S3ObjectStorage(config)
    try:
        with pytest.raises(NotFoundError):
            await store.get("x")
    finally:
        await store.close()


async def test_concurrent_large_uploads(storage: S3ObjectStorage) -> None:
    blobs = [payload(MULTIPART_THRESHOLD_BYTES + i * MiB, seed=20 + i) for i in range(3)]
    await asyncio.gather(*(storage.put(f"c/{i}", blob) for i, blob in enumerate(blobs)))
    for i, blob in enumerate(blobs):
        assert await storage.get(f"c/{i}") == blob


@pytest.mark.parametrize(
    ("access_var", "secret_var"),
    [("KAFKA_S3_ACCESS_KEY", "KAFKA_S3_SECRET_KEY"), ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")],
)
async def test_credentials_come_from_the_environment(
    s3_server: S3TestServer, s3_prefix: str, monkeypatch: pytest.MonkeyPatch, access_var: str, secret_var: str
) -> None:
    for name in ("KAFKA_S3_ACCESS_KEY", "KAFKA_S3_SECRET_KEY", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(access_var, s3_server.access_key)
    monkeypatch.setenv(secret_var, s3_server.secret_key)
    config = replace(contract_config(s3_server, s3_prefix), access_key=None, secret_key=None)
    store = S3ObjectStorage(config)
    try:
        await store.put("env", b"credentials from the environment")
        assert await store.get("env") == b"credentials from the environment"
        await store.delete(["env"])
    finally:
        await store.close()


async def test_incomplete_uploads_are_swept(storage: S3ObjectStorage) -> None:
    client = await storage.client()
    bucket, prefix = storage.config.bucket, storage.config.prefix
    for name in ("orphan-1", "orphan-2"):
        await client.create_multipart_upload(Bucket=bucket, Key=prefix + name)
    assert await storage.abort_incomplete_uploads(older_than_s=3600) == 0  # too young
    assert await storage.abort_incomplete_uploads(older_than_s=-60) == 2
    pending = await client.list_multipart_uploads(Bucket=bucket, Prefix=prefix)
    assert pending.get("Uploads", []) == []
