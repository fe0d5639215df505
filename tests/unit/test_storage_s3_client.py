"""The S3 client's per-request settings: a static User-Agent and the fast response timestamp parser,
checked through botocore's public ``before-send`` hook with canned RGW answers (no server needed)."""

from __future__ import annotations

import datetime
import random
from collections.abc import AsyncIterator
from typing import Any

import botocore.utils
import pytest
from aiobotocore.awsrequest import AioAWSResponse

from s3stream.storage.s3 import S3Config, S3ObjectStorage
from s3stream.storage.s3client import parse_s3_timestamp

LAST_MODIFIED = "Sun, 22 Nov 2026 11:21:18 GMT"
LIST_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?>'
    b'<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
    b"<Name>b</Name><Prefix>p/</Prefix><MaxKeys>1000</MaxKeys><IsTruncated>false</IsTruncated>"
    b"<Contents><Key>p/k</Key><LastModified>2026-11-22T11:21:18.123Z</LastModified>"
    b'<ETag>"abc"</ETag><Size>7</Size><StorageClass>STANDARD</StorageClass></Contents>'
    b"</ListBucketResult>"
)


class _Raw:
    """Just enough of an aiohttp response for botocore's parser."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    async def read(self) -> bytes:
        return self.data


@pytest.fixture
async def canned() -> AsyncIterator[tuple[S3ObjectStorage, list[dict[str, str]]]]:
    storage = S3ObjectStorage(
        S3Config(bucket="b", endpoint="http://127.0.0.1:1", access_key="ak", secret_key="sk", prefix="p/")
    )
    client = await storage.client()
    sent: list[dict[str, str]] = []

    def reply(request: Any, **_: Any) -> AioAWSResponse:
        sent.append(dict(request.headers))
        if request.method == "HEAD":
            headers = {"content-length": "7", "last-modified": LAST_MODIFIED, "etag": '"abc"'}
            return AioAWSResponse(request.url, 200, headers, _Raw(b""))
        return AioAWSResponse(request.url, 200, {"content-type": "application/xml"}, _Raw(LIST_BODY))

    client.meta.events.register("before-send.s3", reply)
    yield storage, sent
    await storage.close()


async def test_timestamps_of_headers_and_listings_are_parsed_by_the_fast_parser(
    canned: tuple[S3ObjectStorage, list[dict[str, str]]],
) -> None:
    storage, _ = canned
    info = await storage.head("k")
    expected = datetime.datetime(2026, 11, 22, 11, 21, 18, tzinfo=datetime.UTC)
    assert info.last_modified_s == expected.timestamp()
    listed = [item async for item in storage.list("")]
    assert [item.key for item in listed] == ["k"]
    assert listed[0].last_modified_s == expected.timestamp() + 0.123
    # botocore's default (dateutil) gives tzutc(); ours gives datetime.UTC, so the parser is in use
    client = await storage.client()
    response = await client.head_object(Bucket="b", Key="p/k")
    assert response["LastModified"].tzinfo is datetime.UTC


async def test_user_agent_is_static_across_operations(
    canned: tuple[S3ObjectStorage, list[dict[str, str]]],
) -> None:
    storage, sent = canned
    await storage.head("k")
    _ = [item async for item in storage.list("")]
    agents = {_text(headers["User-Agent"]) for headers in sent}
    assert len(sent) == 2
    assert len(agents) == 1
    (agent,) = agents
    assert agent.startswith("s3stream aiobotocore/")
    assert "botocore/" in agent
    # botocore's per-request agent carries "ua/2.1" and feature metadata ("m/..."); the static one not
    assert "ua/2.1" not in agent
    assert " m/" not in agent


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


SAMPLES = [
    LAST_MODIFIED,
    "Mon, 01 Jan 2024 00:00:00 GMT",
    "Thu, 29 Feb 2024 23:59:59 GMT",
    "2026-11-22T11:21:18.000Z",
    "2026-11-22T11:21:18Z",
    "2026-11-22T11:21:18.5Z",
    "2026-11-22T11:21:18.123456Z",
    # not on the fast path: botocore's parser decides
    "2026-11-22T11:21:18.1234567Z",
    "2026-11-22T11:21:18+02:00",
    "Sun, 22 Nov 2026 11:21:18 +0100",
    "1700000000",
    "1700000000.25",
    1700000000,
]


@pytest.mark.parametrize("value", SAMPLES)
def test_fast_timestamp_parser_agrees_with_botocore(value: Any) -> None:
    ours = parse_s3_timestamp(value)
    theirs = botocore.utils.parse_timestamp(value)
    assert ours == theirs
    assert ours.timestamp() == theirs.timestamp()
    assert ours.utcoffset() == theirs.utcoffset()


def test_fast_timestamp_parser_agrees_with_botocore_on_random_instants() -> None:
    rng = random.Random(5)
    for _ in range(2000):
        instant = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC) + datetime.timedelta(
            seconds=rng.randrange(0, 4_000_000_000), microseconds=rng.choice([0, rng.randrange(1_000_000)])
        )
        for text in (
            instant.strftime("%a, %d %b %Y %H:%M:%S GMT"),
            instant.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            instant.strftime("%Y-%m-%dT%H:%M:%S.") + f"{instant.microsecond // 1000:03d}Z",
        ):
            assert parse_s3_timestamp(text) == botocore.utils.parse_timestamp(text), text


@pytest.mark.parametrize(
    "value", ["Sun, 31 Feb 2026 11:21:18 GMT", "2026-13-22T11:21:18Z", "Sun, 22 Foo 2026 11:21:18 GMT"]
)
def test_invalid_dates_fail_as_botocore_fails(value: str) -> None:
    with pytest.raises(ValueError, match=r"(?i)invalid|range|must be|month|day"):
        botocore.utils.parse_timestamp(value)
    with pytest.raises(ValueError, match=r"(?i)invalid|range|must be|month|day"):
        parse_s3_timestamp(value)
