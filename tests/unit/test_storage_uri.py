"""Bucket URIs: AutoMQ's s3:// form, file:// and mem://, and what open_storage builds from them."""

from __future__ import annotations

from pathlib import Path

import pytest

from s3stream.errors import InvalidArgumentError
from s3stream.storage.local import LocalObjectStorage
from s3stream.storage.memory import MemoryObjectStorage
from s3stream.storage.s3 import S3ObjectStorage
from s3stream.storage.uri import open_storage, parse_bucket_uri, s3_config_from_uri

AUTOMQ_EXAMPLE = "0@s3://my-bucket?region=us-east-1&endpoint=http://127.0.0.1:9000&pathStyle=true"


def test_automq_example_parses() -> None:
    parsed = parse_bucket_uri(AUTOMQ_EXAMPLE)
    assert (parsed.bucket_id, parsed.protocol, parsed.bucket) == (0, "s3", "my-bucket")
    config = s3_config_from_uri(parsed)
    assert config.bucket == "my-bucket"
    assert config.region == "us-east-1"
    assert config.endpoint == "http://127.0.0.1:9000"
    assert config.path_style is True
    assert config.access_key is None
    assert config.prefix == ""
    assert config.checksum_mode == "when_supported"


def test_all_known_keys() -> None:
    config = s3_config_from_uri(
        parse_bucket_uri(
            "3@s3://b?region=eu-west-1&endpoint=https%3A%2F%2Fs3.example.com&pathStyle=false&accessKey=AK"
            "&secretKey=S%2FK&prefix=tenant%2Fa&checksumMode=when_required&apiCallTimeoutMs=5000"
            "&apiCallAttemptTimeoutMs=1500&multipartThresholdBytes=1048576&partSizeBytes=8388608"
            "&partConcurrency=2&maxInflightRequests=10&listPageSize=50&authType=static"
        )
    )
    assert config.endpoint == "https://s3.example.com"
    assert (config.access_key, config.secret_key) == ("AK", "S/K")
    assert config.prefix == "tenant/a/"
    assert config.checksum_mode == "when_required"
    assert (config.retry.deadline_s, config.retry.attempt_timeout_s) == (5.0, 1.5)
    assert config.multipart_threshold_bytes == 1 << 20
    assert config.part_size_bytes == 8 << 20
    assert (config.part_concurrency_max, config.inflight_requests_max, config.list_page_size) == (2, 10, 50)
    assert "S/K" not in repr(config)


def test_bucket_id_is_optional_and_kept() -> None:
    assert parse_bucket_uri("s3://bkt?region=r").bucket_id == 0
    assert parse_bucket_uri("7@s3://bkt").bucket_id == 7


def test_instance_auth_ignores_uri_keys() -> None:
    config = s3_config_from_uri(parse_bucket_uri("0@s3://b?authType=instance&accessKey=a&secretKey=s"))
    assert config.access_key is None
    assert config.secret_key is None


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("0@s3://b?region=r&colour=blue", "'colour'"),
        ("0@s3://b?region=r&region=s", "'region' given twice"),
        ("0@s3://b?pathStyle=maybe", "pathStyle"),
        ("0@s3://b?listPageSize=0", "listPageSize"),
        ("0@s3://b?listPageSize=2000", "1000"),
        ("0@s3://b?partSizeBytes=1024", "part size"),
        ("0@s3://b?apiCallTimeoutMs=soon", "apiCallTimeoutMs"),
        ("0@s3://b?checksumMode=always", "checksum mode"),
        ("0@s3://b?authType=magic", "authType"),
        ("0@s3://b?accessKey=only", "both"),
        ("0@s3://b?endpoint=ftp://x", "endpoint"),
        ("0@s3://b?prefix=../up", "prefix"),
        ("0@s3://b?region=r,1@s3://c?region=r", "more than one bucket"),
        ("0@gs://b", "protocol"),
        ("0@s3://", "bucket name"),
        ("0@s3://b/extra/path", "bucket name"),
        ("file://relative/path", "absolute"),
        ("file:///tmp/x?sync=false", "'sync'"),
        ("mem://name/path", "mem://name"),
        ("", "empty"),
        ("0@s3://b?region=r&endpoint", "key=value pairs"),
        ("0@s3://b?region=r&&pathStyle=true", "key=value pairs"),
        ("s3://]b", "malformed"),
        ("0@s3://b?endpoint=http://[::1", "endpoint"),
    ],
)
def test_bad_uris_name_the_problem(uri: str, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        s3_config_from_uri(parse_bucket_uri(uri)) if "s3://" in uri else open_storage(uri)


@pytest.mark.parametrize(
    "uri",
    [
        "0@gs://b?accessKey=a&secretKey=TOPSECRET",
        "0@s3://b/path?accessKey=a&secretKey=TOPSECRET",
        "0@s3://b?accessKey=a&secretKey=TOPSECRET&x",
        "0@s3://b?secretKey=TOPSECRET,1@s3://c",
    ],
)
def test_errors_never_show_the_secret_key(uri: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        parse_bucket_uri(uri)
    assert "TOPSECRET" not in str(info.value)


async def test_open_storage_builds_each_backend(tmp_path: Path) -> None:
    s3 = open_storage(AUTOMQ_EXAMPLE)
    assert isinstance(s3, S3ObjectStorage)
    await s3.close()
    local = open_storage(f"file://{tmp_path}/objects")
    assert isinstance(local, LocalObjectStorage)
    assert local.root == tmp_path / "objects"
    await local.put("k", b"v")
    assert (tmp_path / "objects" / "k").read_bytes() == b"v"
    await local.close()


async def test_memory_stores_are_shared_by_name_until_closed() -> None:
    a = open_storage("mem://uri-test")
    b = open_storage("0@mem://uri-test")
    assert isinstance(a, MemoryObjectStorage)
    assert a is b
    assert open_storage("mem://uri-test-other") is not a
    await a.put("k", b"v")
    await a.close()
    c = open_storage("mem://uri-test")
    assert c is not a
    assert [info async for info in c.list()] == []
    await c.close()
