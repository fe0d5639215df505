"""A GetObject body is read chunk by chunk off aiohttp's stream and joined once (no intermediate
joins), with the same length check as ``StreamingBody.read()``; checked with canned answers through
botocore's ``before-send`` hook and aiohttp's own ``StreamReader`` (no server needed)."""

from __future__ import annotations

import asyncio
import base64
import zlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import botocore.exceptions
import pytest
from aiobotocore.awsrequest import AioAWSResponse
from aiobotocore.httpchecksum import AioStreamingChecksumBody
from aiobotocore.response import AioStreamingBody
from botocore.httpchecksum import Crc32Checksum

from s3stream.storage.s3 import S3Config, S3ObjectStorage, read_body


class _Protocol:
    """What aiohttp's StreamReader asks of its connection's protocol."""

    connected = True
    _reading_paused = False

    def __init__(self) -> None:
        self.pauses = 0

    def pause_reading(self) -> None:
        self.pauses += 1

    def resume_reading(self, resume_parser: bool = True) -> None:
        del resume_parser


class _Raw:
    """Just enough of an aiohttp ClientResponse: its body stream, fed chunk by chunk."""

    def __init__(self, chunks: list[bytes], *, later: list[bytes] | None = None) -> None:
        self.protocol = _Protocol()
        self.content = aiohttp.StreamReader(self.protocol, 2**16, loop=asyncio.get_running_loop())  # type: ignore[arg-type]
        for chunk in chunks:
            self.content.feed_data(chunk)
        if later is None:
            self.content.feed_eof()
        else:
            asyncio.get_running_loop().call_soon(self._feed_later, later)

    def _feed_later(self, chunks: list[bytes]) -> None:
        for chunk in chunks:
            self.content.feed_data(chunk)
        self.content.feed_eof()

    def close(self) -> None:
        pass


def _no_readany(self: aiohttp.StreamReader) -> Any:
    raise AssertionError("StreamReader.readany joins what arrived since the last wake-up: an extra copy")


@pytest.fixture
async def canned() -> AsyncIterator[tuple[S3ObjectStorage, list[bytes]]]:
    """A storage whose GETs answer with the body ``chunks[0]`` split into 4 chunks, 2 of them late."""
    storage = S3ObjectStorage(
        S3Config(bucket="b", endpoint="http://127.0.0.1:1", access_key="ak", secret_key="sk", prefix="p/")
    )
    client = await storage.client()
    body: list[bytes] = []

    def reply(request: Any, **_: Any) -> AioAWSResponse:
        data = body[0]
        q = len(data) // 4
        pieces = [data[:q], data[q : 2 * q], data[2 * q : 3 * q], data[3 * q :]]
        headers = {"content-length": str(len(data)), "content-range": f"bytes 0-{len(data) - 1}/{len(data)}"}
        return AioAWSResponse(request.url, 206, headers, _Raw(pieces[:2], later=pieces[2:]))

    client.meta.events.register("before-send.s3", reply)
    yield storage, body
    await storage.close()


async def test_a_get_body_is_read_chunk_by_chunk_and_joined_once(
    canned: tuple[S3ObjectStorage, list[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    storage, body = canned
    body.append(bytes(range(256)) * 1000)
    monkeypatch.setattr(aiohttp.StreamReader, "readany", _no_readany)
    monkeypatch.setattr(aiohttp.StreamReader, "read", _no_readany)
    assert await storage.get("k", 0, len(body[0])) == body[0]


async def test_a_one_chunk_body_is_returned_without_a_copy() -> None:
    chunk = b"x" * 100_000
    raw = _Raw([chunk])
    assert await read_body(AioStreamingBody(raw, len(chunk)), len(chunk)) is chunk


async def test_the_socket_is_not_paused_while_a_large_body_arrives() -> None:
    chunks = [b"head"] + [bytes([i]) * 200_000 for i in range(8)]
    raw = _Raw(chunks[:1], later=chunks[1:])
    data = await read_body(AioStreamingBody(raw, 1_600_004), "1600004")
    assert data == b"".join(chunks)
    assert raw.protocol.pauses == 0  # as read(): the buffer limit is raised to the body's length


async def test_a_body_shorter_than_its_content_length_is_an_incomplete_read() -> None:
    raw = _Raw([b"abc", b"def"])
    with pytest.raises(botocore.exceptions.IncompleteReadError):
        await read_body(AioStreamingBody(raw, 10), 10)


async def test_a_checksum_validating_body_still_validates() -> None:
    data = b"checked bytes"
    good = base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()
    body = AioStreamingChecksumBody(_Raw([data[:5], data[5:]]), len(data), Crc32Checksum(), good)
    assert await read_body(body, len(data)) == data
    bad = base64.b64encode((zlib.crc32(data) ^ 1).to_bytes(4, "big")).decode()
    body = AioStreamingChecksumBody(_Raw([data[:5], data[5:]]), len(data), Crc32Checksum(), bad)
    with pytest.raises(botocore.exceptions.FlexibleChecksumError):
        await read_body(body, len(data))
