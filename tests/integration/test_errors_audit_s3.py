"""Errors audit against a real S3 server: a misconfigured bucket fails the open with a typed error.

Before, ``open`` succeeded whatever the bucket or the credentials; the first upload (seconds later, or at
the first close) failed the whole engine with the same error, after appends had been acknowledged.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import pytest

from s3stream.assembly import open_client
from s3stream.errors import InvalidArgumentError, NotFoundError
from s3stream.model import RecordBatch
from tests.support.configs import small_config
from tests.support.s3 import S3TestServer

MiB = 1 << 20
CONFIG = small_config()


def _uri(server: S3TestServer, *, bucket: str, access_key: str, secret_key: str) -> str:
    return (
        f"0@s3://{bucket}?region={server.region}&endpoint={quote(server.endpoint, safe=':/')}"
        f"&pathStyle=true&accessKey={quote(access_key)}&secretKey={quote(secret_key)}"
    )


async def test_open_on_a_missing_bucket_is_not_found(s3_server: S3TestServer, tmp_path: Path) -> None:
    uri = _uri(s3_server, bucket="s3stream-no-such-bucket", access_key=s3_server.access_key,
               secret_key=s3_server.secret_key)  # fmt: skip
    with pytest.raises(NotFoundError, match="LIST s3://s3stream-no-such-bucket/: NoSuchBucket"):
        await open_client(tmp_path, bucket_uri=uri, config=CONFIG)


async def test_open_with_wrong_credentials_is_an_invalid_argument(
    s3_server: S3TestServer, tmp_path: Path
) -> None:
    uri = _uri(s3_server, bucket=s3_server.bucket, access_key="s3stream-wrong", secret_key="wrong")
    with pytest.raises(InvalidArgumentError, match="access denied; check the credentials"):
        await open_client(tmp_path, bucket_uri=uri, config=CONFIG)


async def test_open_on_a_good_bucket_and_prefix_still_works(
    s3_server: S3TestServer, s3_prefix: str, tmp_path: Path
) -> None:
    async with await open_client(tmp_path, bucket_uri=s3_server.uri(s3_prefix), config=CONFIG) as client:
        stream = await client.streams.create_and_open_stream()
        assert await stream.append(RecordBatch(b"a")) == 0
        await stream.close()
