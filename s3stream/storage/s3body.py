"""Request bodies made of pieces, handed to botocore and aiohttp without being joined or copied.

An S3 upload keeps its data as *pieces*: ``(buffer, start, end)`` slices of pages it owns (or of
immutable ``bytes`` it was given whole). :class:`PiecesReader` is the body botocore sees: a seekable
file-like object, so it validates, measures (``len``), hashes (SigV4 payload hash, CRC32 checksum)
and rewinds the body by reading it in chunks. :func:`send_pieces_as_views`, registered on the
client's ``before-send`` event, then replaces the reader by :class:`PiecesPayload`, which hands
aiohttp one ``memoryview`` per piece (cut into ``WRITE_CHUNK_BYTES``): no joined copy, and no
copy in aiohttp (its ``BytesPayload`` slices ``bytes`` to the content length, and its header
coalescing joins the first chunk with the headers: both copy a whole body).

SigV4 over plain HTTP signs the body's SHA-256. botocore would hash it on the event loop, reading
it through :class:`PiecesReader` in 1 MiB copies (~1.2 ms per MiB of loop time, one stall of ~20 ms
for a 16 MiB part). The S3 layer instead computes the digest with :func:`digest_pieces` in a
worker thread (hashlib releases the GIL) and hands it over as ``PiecesReader.sha256_hex``; the
signer of :mod:`s3stream.storage.s3` uses it instead of reading the body. With flexible checksums
on (``when_supported``) the same pass computes the CRC32 botocore would otherwise compute on the
loop, and the request carries it as ``ChecksumCRC32`` (botocore then leaves the body alone).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp.abc import AbstractStreamWriter
from aiohttp.payload import Payload

Piece = tuple[bytes | bytearray, int, int]
"""``(buffer, start, end)``: bytes ``[start, end)`` of a buffer the upload owns or may keep."""

WRITE_CHUNK_BYTES = 256 * 1024
"""Largest slice handed to the transport at once, one per event-loop step: what the kernel copies
(and, over loopback, delivers) in one step (a 1 MiB slice held the loop ~2 ms)."""
FIRST_CHUNK_BYTES = 16 * 1024
"""The first slice is small: aiohttp joins it with the request headers (a copy)."""


@dataclass(frozen=True, slots=True)
class BodyDigests:
    """What the S3 layer precomputes for one request body (see :func:`digest_pieces`)."""

    sha256_hex: str
    crc32_base64: str | None
    """The body's CRC32 as S3's ``x-amz-checksum-crc32`` header wants it (None: not computed)."""


def digest_pieces(pieces: Sequence[Piece], *, crc32: bool) -> BodyDigests:
    """SHA-256 (and CRC32 if asked) of the body the pieces make, in one pass.

    Runs in a worker thread (it touches no event loop state); hashlib and zlib release the GIL on
    large buffers, so the loop runs meanwhile.
    """
    digest = hashlib.sha256()
    crc = 0
    for source, start, end in pieces:
        view = memoryview(source)[start:end]
        digest.update(view)
        if crc32:
            crc = zlib.crc32(view, crc)
    crc_b64 = base64.b64encode(crc.to_bytes(4, "big")).decode("ascii") if crc32 else None
    return BodyDigests(digest.hexdigest(), crc_b64)


def digest_params(digests: BodyDigests | None) -> dict[str, str]:
    """Request parameters carrying precomputed digests (the CRC32 flexible checksum, if computed)."""
    if digests is None or digests.crc32_base64 is None:
        return {}
    return {"ChecksumCRC32": digests.crc32_base64}


class PiecesReader(io.RawIOBase):
    """A read-only, seekable file over pieces (what botocore reads to size, and unless
    ``sha256_hex`` is given, to hash the body)."""

    def __init__(self, pieces: Sequence[Piece], *, sha256_hex: str | None = None) -> None:
        super().__init__()
        self.pieces = tuple(pieces)
        self.sha256_hex = sha256_hex
        """The body's SHA-256 (hex), computed off the event loop; None: the signer hashes it."""
        self._size_bytes = sum(end - start for _, start, end in self.pieces)
        self._position = 0
        self._index = 0  # piece holding self._position (or len(pieces) at the end)
        self._index_start = 0  # body position where piece self._index starts

    def __len__(self) -> int:
        return self._size_bytes - self._position

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._size_bytes}[whence]
        position = min(max(0, base + offset), self._size_bytes)
        self._position, self._index, self._index_start = position, 0, 0
        while self._index < len(self.pieces):
            _, start, end = self.pieces[self._index]
            if position < self._index_start + end - start:
                break
            self._index_start += end - start
            self._index += 1
        return position

    def read(self, size: int | None = -1) -> bytes:
        """Up to ``size`` bytes (all that is left if negative), built with one allocation."""
        left = self._size_bytes - self._position
        n = left if size is None or size < 0 else min(size, left)
        if self._index < len(self.pieces):
            source, start, end = self.pieces[self._index]
            at = start + self._position - self._index_start
            if end - at >= n:  # within one piece: a single copy
                self.seek(self._position + n)
                return bytes(memoryview(source)[at : at + n])
        out = bytearray(n)
        done = self.readinto(out)
        return bytes(out[:done]) if done < n else bytes(out)

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer: Any) -> int:
        target = memoryview(buffer).cast("B")
        done = 0
        while done < target.nbytes and self._index < len(self.pieces):
            source, start, end = self.pieces[self._index]
            at = start + self._position - self._index_start
            n = min(end - at, target.nbytes - done)
            target[done : done + n] = memoryview(source)[at : at + n]
            done += n
            self._position += n
            if at + n == end:
                self._index_start += end - start
                self._index += 1
        return done


class PiecesPayload(Payload):
    """An aiohttp payload that writes pieces as memoryviews; reusable (aiohttp may resend it)."""

    _autoclose = True

    def __init__(self, pieces: Sequence[Piece]) -> None:
        super().__init__(tuple(pieces), content_type="application/octet-stream")
        self._size = sum(end - start for _, start, end in pieces)

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        return b"".join(memoryview(b)[s:e] for b, s, e in self._value).decode(encoding, errors)

    async def as_bytes(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        return b"".join(memoryview(b)[s:e] for b, s, e in self._value)

    async def write(self, writer: AbstractStreamWriter) -> None:
        await self.write_with_length(writer, None)

    async def write_with_length(self, writer: AbstractStreamWriter, content_length: int | None) -> None:
        size = sum(end - start for _, start, end in self._value)
        left = size if content_length is None else min(content_length, size)
        chunk = FIRST_CHUNK_BYTES
        first = True
        for source, at, end in self._value:
            view = memoryview(source)
            while at < end and left > 0:
                if not first:
                    # aiohttp's drain waits only once the transport is paused (its buffer past the
                    # high-water mark): while the socket takes every chunk, a whole part would go
                    # out in one loop step (~0.15-0.5 ms of kernel send per 256 KiB)
                    await asyncio.sleep(0)
                n = min(end - at, chunk, left)
                await writer.write(view[at : at + n])
                at += n
                left -= n
                chunk = WRITE_CHUNK_BYTES
                first = False


def send_pieces_as_views(request: Any, **_: Any) -> None:
    """``before-send`` handler: after botocore has sized, hashed and signed a :class:`PiecesReader`
    body, send it as a :class:`PiecesPayload` (returns None: the request goes on as usual)."""
    if isinstance(request.body, PiecesReader):
        request.body = PiecesPayload(request.body.pieces)
