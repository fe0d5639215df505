"""On a real S3 server: a data dir reopens on the bucket it was created on without a bucket URI, and a
first open that S3 refuses (missing bucket, bad keys) leaves no WAL file or data dir behind."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import s3stream
from s3stream import Config, RecordBatch
from s3stream.binding import read_recorded_storage
from s3stream.storage.s3 import S3ObjectStorage
from tests.support.s3 import S3TestServer

pytestmark = pytest.mark.integration

CONFIG = Config(wal_capacity_bytes=8 << 20, wal_record_max_bytes=1 << 20, record_max_bytes=1 << 20)


async def test_a_data_dir_on_s3_reopens_there_without_a_bucket_uri(
    tmp_path: Path, s3_server: S3TestServer, s3_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with await s3stream.open(tmp_path, bucket_uri=s3_server.uri(s3_prefix), config=CONFIG) as client:
        stream = await client.streams.create_and_open_stream()
        await stream.append(RecordBatch(b"on s3"))
        await stream.close()
    record = read_recorded_storage(tmp_path)
    assert record is not None
    assert record.bucket_uri is not None
    assert s3_server.secret_key not in record.bucket_uri
    assert s3_server.access_key not in record.bucket_uri
    # credentials come from the environment, as for any URI without keys
    monkeypatch.setenv("KAFKA_S3_ACCESS_KEY", s3_server.access_key)
    monkeypatch.setenv("KAFKA_S3_SECRET_KEY", s3_server.secret_key)
    async with await s3stream.open(tmp_path, config=CONFIG) as client:
        storage = client.engine.storage
        assert isinstance(storage, S3ObjectStorage)
        assert (storage.config.bucket, storage.config.prefix) == (s3_server.bucket, s3_prefix)
        (meta,) = await client.streams.list_streams()
        stream = await client.streams.open_stream(meta.stream_id, epoch=1)
        client.engine.cache.try_real_free(target_bytes=0)
        assert [b.payload for b in await stream.fetch(0, 1)] == [b"on s3"]
        await stream.append(RecordBatch(b"again"))
        await stream.close()
        assert client.engine.stats.uploads >= 1
    assert not (tmp_path / "objects").exists()


def refused_uris(server: S3TestServer, prefix: str) -> dict[str, str]:
    return {
        "missing bucket": dataclasses.replace(server, bucket="s3stream-no-such-bucket-7f3a").uri(prefix),
        "bad keys": dataclasses.replace(server, secret_key=server.secret_key + "-wrong").uri(prefix),
    }


@pytest.mark.parametrize("case", ["missing bucket", "bad keys"])
async def test_a_refused_first_open_leaves_nothing_behind(
    tmp_path: Path, s3_server: S3TestServer, s3_prefix: str, case: str
) -> None:
    data_dir = tmp_path / "data"
    with pytest.raises((s3stream.NotFoundError, s3stream.InvalidArgumentError)):
        await s3stream.open(data_dir, bucket_uri=refused_uris(s3_server, s3_prefix)[case], config=CONFIG)
    assert not data_dir.exists()
    assert list(tmp_path.iterdir()) == []


async def test_bad_keys_on_an_existing_data_dir_remove_nothing(
    tmp_path: Path, s3_server: S3TestServer, s3_prefix: str
) -> None:
    async with await s3stream.open(tmp_path, bucket_uri=s3_server.uri(s3_prefix), config=CONFIG) as client:
        stream = await client.streams.create_and_open_stream()
        await stream.append(RecordBatch(b"kept"))
    before = {p.relative_to(tmp_path): p.stat().st_size for p in tmp_path.rglob("*")}
    with pytest.raises(s3stream.InvalidArgumentError):
        await s3stream.open(
            tmp_path, bucket_uri=refused_uris(s3_server, s3_prefix)["bad keys"], config=CONFIG
        )
    assert {p.relative_to(tmp_path): p.stat().st_size for p in tmp_path.rglob("*")} == before
    async with await s3stream.open(tmp_path, bucket_uri=s3_server.uri(s3_prefix), config=CONFIG) as client:
        (meta,) = await client.streams.list_streams()
        assert meta.end_offset == 1
