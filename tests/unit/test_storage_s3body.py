"""PiecesReader and PiecesPayload: the body botocore reads and the views aiohttp sends match the joined
bytes exactly, for any split into pieces, any seek and any content length."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import itertools
import random
import zlib
from typing import Any

import pytest

from s3stream.storage import s3body
from s3stream.storage.s3body import (
    Piece,
    PiecesPayload,
    PiecesReader,
    digest_params,
    digest_pieces,
    send_pieces_as_views,
)


def _pieces(rng: random.Random, total: int) -> tuple[list[Piece], bytes]:
    data = rng.randbytes(total)
    pieces: list[Piece] = []
    at = 0
    while at < total:
        n = rng.randint(1, max(1, total // 3))
        chunk = data[at : at + n]
        pad = rng.randint(0, 5)
        buffer = bytearray(rng.randbytes(pad) + chunk + rng.randbytes(pad)) if rng.random() < 0.5 else chunk
        start = pad if isinstance(buffer, bytearray) else 0
        pieces.append((buffer, start, start + len(chunk)))
        at += len(chunk)
    return pieces, data


class _RecordingWriter:
    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.views = 0

    async def write(self, chunk: bytes | bytearray | memoryview) -> None:
        self.views += isinstance(chunk, memoryview)
        self.chunks.append(bytes(chunk))


@pytest.mark.parametrize("seed", range(20))
def test_reader_reads_and_seeks_like_the_joined_bytes(seed: int) -> None:
    rng = random.Random(seed)
    pieces, data = _pieces(rng, rng.randint(0, 5000))
    reader = PiecesReader(pieces)
    assert len(reader) == len(data)
    assert reader.read() == data
    assert reader.read(10) == b""
    assert len(reader) == 0
    for _ in range(20):
        position = rng.randint(0, len(data) + 3)
        assert reader.seek(position) == min(position, len(data))
        n = rng.randint(0, 700)
        assert reader.read(n) == data[min(position, len(data)) : position + n]
    reader.seek(-7, io.SEEK_END)
    assert reader.read() == data[max(0, len(data) - 7) :]


@pytest.mark.parametrize("seed", range(10))
async def test_payload_writes_views_of_the_pieces(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(s3body, "WRITE_CHUNK_BYTES", 64)
    monkeypatch.setattr(s3body, "FIRST_CHUNK_BYTES", 16)
    rng = random.Random(seed)
    pieces, data = _pieces(rng, rng.randint(1, 3000))
    payload = PiecesPayload(pieces)
    assert payload.size == len(data)
    for limit in (None, len(data), rng.randint(0, len(data))):
        writer = _RecordingWriter()
        await payload.write_with_length(writer, limit)  # type: ignore[arg-type]
        assert b"".join(writer.chunks) == data[:limit]
        assert writer.views == len(writer.chunks)
        assert all(len(c) <= 64 for c in writer.chunks)
        assert len(writer.chunks[0]) <= 16 if writer.chunks else True
    assert await payload.as_bytes() == data


async def test_payload_lets_the_loop_run_between_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """aiohttp's drain does not yield while the socket takes everything: the payload yields itself,
    so a part does not go out in one event-loop step."""
    monkeypatch.setattr(s3body, "WRITE_CHUNK_BYTES", 64)
    monkeypatch.setattr(s3body, "FIRST_CHUNK_BYTES", 16)
    payload = PiecesPayload([(bytes(500), 0, 500)])
    turns = 0
    seen: list[int] = []

    async def ticker() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    class Writer(_RecordingWriter):
        async def write(self, chunk: Any) -> None:
            seen.append(turns)
            await super().write(chunk)

    task = asyncio.ensure_future(ticker())
    await asyncio.sleep(0)
    try:
        await payload.write_with_length(Writer(), None)  # type: ignore[arg-type]
    finally:
        task.cancel()
    assert len(seen) == 9  # 16 + 7 x 64 + 36 bytes
    assert all(a < b for a, b in itertools.pairwise(seen)), seen


def test_before_send_swaps_only_pieces_readers() -> None:
    class Request:
        body: object

    request = Request()
    request.body = PiecesReader([(b"abc", 1, 3)])
    send_pieces_as_views(request)
    assert isinstance(request.body, PiecesPayload)
    assert request.body.size == 2
    request.body = b"plain"
    send_pieces_as_views(request)
    assert request.body == b"plain"


@pytest.mark.parametrize("seed", range(10))
def test_digest_pieces_matches_the_joined_body(seed: int) -> None:
    rng = random.Random(seed)
    pieces, data = _pieces(rng, rng.randint(0, 5000))
    digests = digest_pieces(pieces, crc32=True)
    assert digests.sha256_hex == hashlib.sha256(data).hexdigest()
    assert digests.crc32_base64 == base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()
    assert digest_params(digests) == {"ChecksumCRC32": digests.crc32_base64}
    without = digest_pieces(pieces, crc32=False)
    assert without.sha256_hex == digests.sha256_hex
    assert without.crc32_base64 is None
    assert digest_params(without) == {} == digest_params(None)


def _signed_request(body: object) -> dict[str, str]:
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    from s3stream.storage.s3client import PrehashedS3SigV4Auth

    request = AWSRequest(method="PUT", url="http://127.0.0.1:7480/bucket/key", data=body)
    request.context["timestamp"] = "20260101T000000Z"
    PrehashedS3SigV4Auth(Credentials("ak", "sk"), "s3", "us-east-1").add_auth(request)
    return dict(request.headers)


def test_prehashed_signer_signs_exactly_as_botocore_without_reading_the_body() -> None:
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    pieces, data = _pieces(random.Random(7), 3000)
    stock = AWSRequest(method="PUT", url="http://127.0.0.1:7480/bucket/key", data=PiecesReader(pieces))
    stock.context["timestamp"] = "20260101T000000Z"
    S3SigV4Auth(Credentials("ak", "sk"), "s3", "us-east-1").add_auth(stock)

    class Unreadable(PiecesReader):
        def read(self, size: int | None = -1) -> bytes:
            raise AssertionError("the signer read a prehashed body")

    prehashed = _signed_request(Unreadable(pieces, sha256_hex=hashlib.sha256(data).hexdigest()))
    assert prehashed["Authorization"] == stock.headers["Authorization"]
    assert prehashed["X-Amz-Content-SHA256"] == hashlib.sha256(data).hexdigest()
    # without a digest it falls back to botocore's own hashing
    assert _signed_request(PiecesReader(pieces))["Authorization"] == stock.headers["Authorization"]


def test_prehashed_signer_is_chosen_only_for_sigv4() -> None:
    from s3stream.storage.s3client import PREHASHED_SIGNER, choose_prehashed_signer

    assert choose_prehashed_signer(signature_version="s3v4") == PREHASHED_SIGNER
    assert choose_prehashed_signer(signature_version="s3v4a") is None
    assert choose_prehashed_signer(signature_version="s3-query") is None
