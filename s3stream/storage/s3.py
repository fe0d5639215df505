"""S3ObjectStorage: the ObjectStorage protocol over S3 (AWS, MinIO, Ceph RGW) through aiobotocore.

Requests: single PutObject up to ``multipart_threshold_bytes`` (32 MiB; a streamed upload stages at
most ``part_concurrency_max * part_size_bytes`` of it), multipart above it with parts of
``part_size_bytes`` (>= 5 MiB) uploaded concurrently (at most ``part_concurrency_max`` per upload,
which bounds an upload's buffers, see :mod:`s3stream.storage.s3upload`); ranged GetObject; HeadObject; DeleteObjects in batches of <= 1000 keys; ListObjectsV2 by
prefix, ``list_page_size`` keys per page; UploadPartCopy for copied ranges of >= 5 MiB (AutoMQ's
rules, see :mod:`s3stream.storage.s3upload`); conditional create with ``If-None-Match: *``. At most
``inflight_requests_max`` requests are on the wire at once; every attempt runs under a timeout.

Retries, error translation, payload hashing and credentials: :mod:`s3stream.storage.s3client`.
Ranged GETs to an http, path-style endpoint with static keys are signed and sent without botocore
(:mod:`s3stream.storage.s3get`); every connection ACKs responses at once
(:mod:`s3stream.storage.s3quickack`).

The ETag of CompleteMultipartUpload is never used (Ceph 16 returns an empty one). A conditional
PUT that meets 412 checks whether the stored object is its own (same size and MD5 ETag): an earlier
attempt that succeeded but whose answer was lost is a win, not a conflict. (A rival that wrote the
very same bytes is indistinguishable, and harmless: callers put a unique owner id in the body.)
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import aiohttp
from aiobotocore.response import AioStreamingBody

from s3stream.errors import ClosedError, ConflictError, InvalidArgumentError, NotFoundError, UnavailableError
from s3stream.storage.base import MAX_DELETE_BATCH, MAX_PART_SIZE_BYTES, ObjectInfo, Upload
from s3stream.storage.keys import resolve_range, validate_prefix, validate_range
from s3stream.storage.s3body import Piece, PiecesReader, digest_params
from s3stream.storage.s3client import TRANSIENT_CODES, S3Client, S3Config
from s3stream.storage.s3get import read_stream
from s3stream.storage.s3upload import S3Upload

__all__ = ["S3Config", "S3ObjectStorage", "read_body"]


async def read_body(body: Any, content_length: object) -> bytes:
    """The whole body of a GetObject response: aiohttp's chunks as they arrived, joined once.

    ``StreamingBody.read()`` copies a body twice more than needed: aiohttp's ``readany`` joins the
    chunks that arrived since the reader last woke up, then ``read`` joins those (with the parser's
    copy of each chunk, three copies of every byte; a fresh multi-MiB buffer costs page faults, and
    the copies were a third of a GET's client CPU per MB). A body that validates a checksum as it is
    read (flexible checksums on) reads itself. A body shorter than its Content-Length raises
    botocore's ``IncompleteReadError`` (transient), as ``read()`` does.
    """
    content = getattr(getattr(body, "raw_stream", None), "content", None)
    raise_limit = getattr(content, "set_read_chunk_size", None)  # not in every aiohttp: then read()
    if (
        type(body) is not AioStreamingBody
        or not isinstance(content, aiohttp.StreamReader)
        or raise_limit is None
    ):
        data: bytes = await body.read()
        return data
    return await read_stream(content, content_length)


def _etag(raw: object) -> str:
    return str(raw or "").strip('"')


class S3ObjectStorage(S3Client):
    """One bucket (and optional prefix) of an S3-compatible store; see the module docstring."""

    # -- ObjectStorage -----------------------------------------------------------------------

    async def put(self, key: str, data: bytes | bytearray | memoryview, *, if_absent: bool = False) -> None:
        full = self.full_key(key)
        size = memoryview(data).nbytes
        if size > self.config.multipart_threshold_bytes and not if_absent:
            upload = self.upload(key)
            try:
                await upload.write(data)
                await upload.complete()
            except BaseException:
                await upload.abort()
                raise
            return
        if size > MAX_PART_SIZE_BYTES:
            raise InvalidArgumentError(
                f"conditional put of {key!r}: {size} bytes is above S3's single PUT limit"
            )
        body = data if isinstance(data, (bytes, bytearray)) else bytes(data)
        await self.put_pieces(full, key, [(body, 0, len(body))], if_absent=if_absent)

    async def put_pieces(
        self, full: str, key: str, pieces: Sequence[Piece], *, if_absent: bool = False
    ) -> None:
        """One PutObject whose body is ``pieces`` (sent without joining or copying them)."""
        extra = {"IfNoneMatch": "*"} if if_absent else {}
        size = sum(end - start for _, start, end in pieces)
        digests = await self.body_digests(pieces, size)
        extra.update(digest_params(digests))

        async def attempt(client: Any) -> None:
            body = PiecesReader(pieces, sha256_hex=digests.sha256_hex if digests else None)
            await client.put_object(Bucket=self.config.bucket, Key=full, Body=body, **extra)

        try:
            await self.call("PUT", repr(key), attempt, size_bytes=size)
        except ConflictError:
            # Our retry, or aiohttp's silent resend of an idempotent PUT on a reset keep-alive
            # connection, may meet the object an earlier attempt of ours created.
            if not await self._holds(full, key, pieces, size):
                raise
        self.stats.record("put", size)

    async def _holds(self, full: str, key: str, pieces: Sequence[Piece], size: int) -> bool:
        """Whether ``key`` holds exactly ``pieces`` (an earlier attempt of ours won after all)."""
        try:
            info = await self._head(full, key)
        except NotFoundError:
            return False
        if info.size_bytes != size:
            return False
        md5 = hashlib.md5(usedforsecurity=False)
        for buffer, start, end in pieces:
            md5.update(memoryview(buffer)[start:end])
        return info.etag == md5.hexdigest()

    def upload(self, key: str, *, buffer_max_bytes: int | None = None, if_absent: bool = False) -> Upload:
        """See :class:`~s3stream.storage.s3upload.S3Upload`; ``buffer_max_bytes`` picks smaller or
        fewer parts in flight (:func:`~s3stream.storage.s3upload.upload_shape`). ``if_absent``: a
        create-only upload (``If-None-Match: *`` on its PUT or CompleteMultipartUpload)."""

        full = self.full_key(key)
        if self._closed:
            raise ClosedError(f"{self!r} is closed")
        return S3Upload(self, key, full, buffer_max_bytes=buffer_max_bytes, if_absent=if_absent)

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        full = self.full_key(key)
        start, end = validate_range(key, start, end)
        if end is not None and start == end:
            return b""
        extra: dict[str, str] = {}
        if end is not None:
            extra["Range"] = f"bytes={start}-{end - 1}"
        elif start > 0:
            extra["Range"] = f"bytes={start}-"

        async def attempt(client: Any) -> tuple[bytes, str]:
            getter = self._ranged_getter
            if getter is not None and "Range" in extra:  # (set with the client, before any attempt)
                return await getter.get(full, extra["Range"])
            response = await client.get_object(Bucket=self.config.bucket, Key=full, **extra)
            async with response["Body"] as stream:
                data = await read_body(stream, response.get("ContentLength"))
            return data, str(response.get("ContentRange", ""))

        try:
            data, content_range = await self.call(
                "GET", repr(key), attempt, size_bytes=0 if end is None else end - start
            )
        except InvalidArgumentError:
            if end is not None or start == 0:
                raise
            # "bytes=N-" on an N-byte object is 416 on S3 but an empty read in our contract.
            size = (await self.head(key)).size_bytes
            resolve_range(key, start, None, size)
            return b""
        if end is not None and len(data) != end - start:
            total = content_range.rpartition("/")[2]
            raise InvalidArgumentError(
                f"read of {key!r}: range [{start}, {end}) lies beyond the object's {total or '?'} bytes"
            )
        self.stats.record("get", len(data))
        return data

    async def _head(self, full: str, key: str) -> ObjectInfo:
        async def attempt(client: Any) -> ObjectInfo:
            response = await client.head_object(Bucket=self.config.bucket, Key=full)
            return ObjectInfo(
                key,
                int(response["ContentLength"]),
                response["LastModified"].timestamp(),
                _etag(response.get("ETag")),
            )

        info = await self.call("HEAD", repr(key), attempt)
        self.stats.record("head")
        return info

    async def head(self, key: str) -> ObjectInfo:
        return await self._head(self.full_key(key), key)

    async def delete(self, keys: Sequence[str]) -> None:
        fulls = list(dict.fromkeys(self.full_key(key) for key in keys))
        batches = [fulls[i : i + MAX_DELETE_BATCH] for i in range(0, len(fulls), MAX_DELETE_BATCH)]
        await asyncio.gather(*(self._delete_batch(batch) for batch in batches))

    async def _delete_batch(self, batch: list[str]) -> None:
        pending = batch

        async def attempt(client: Any) -> None:
            nonlocal pending
            response = await client.delete_objects(
                Bucket=self.config.bucket,
                Delete={"Objects": [{"Key": key} for key in pending], "Quiet": True},
            )
            self.stats.record("delete")
            retry: list[str] = []
            for error in response.get("Errors", []):
                code = str(error.get("Code", ""))
                if code == "NoSuchKey":
                    continue
                if code in TRANSIENT_CODES:
                    retry.append(str(error["Key"]))
                    continue
                raise InvalidArgumentError(f"DELETE {error.get('Key')!r}: {code}: {error.get('Message')}")
            pending = retry
            if retry:
                raise UnavailableError(f"DELETE: {len(retry)} keys failed transiently, e.g. {retry[0]!r}")

        await self.call("DELETE", f"{len(batch)} keys", attempt)

    async def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        validate_prefix(prefix)
        full_prefix = self.config.prefix + prefix
        strip = len(self.config.prefix)
        token: str | None = None
        while True:
            extra = {"ContinuationToken": token} if token else {}

            async def attempt(client: Any, extra: dict[str, str] = extra) -> Any:
                return await client.list_objects_v2(
                    Bucket=self.config.bucket, Prefix=full_prefix, MaxKeys=self.config.list_page_size, **extra
                )

            page = await self.call("LIST", repr(full_prefix), attempt)
            self.stats.record("list")
            for item in page.get("Contents", []):
                yield ObjectInfo(
                    item["Key"][strip:],
                    int(item["Size"]),
                    item["LastModified"].timestamp(),
                    _etag(item.get("ETag")),
                )
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return

    async def abort_incomplete_uploads(self, older_than_s: float = 3600.0) -> int:
        """Abort multipart uploads under our prefix started more than ``older_than_s`` ago.

        A writer that crashed mid-upload leaves its parts invisible but billed; run this at
        startup (or rely on a bucket lifecycle rule). Returns how many uploads were aborted.
        """
        cutoff_s = time.time() - older_than_s
        aborted = 0
        markers: dict[str, str] = {}
        while True:

            async def page_attempt(client: Any, markers: dict[str, str] = markers) -> Any:
                return await client.list_multipart_uploads(
                    Bucket=self.config.bucket, Prefix=self.config.prefix, **markers
                )

            page = await self.call("ListMultipartUploads", repr(self.config.prefix), page_attempt)
            for item in page.get("Uploads", []):
                if item["Initiated"].timestamp() >= cutoff_s:
                    continue

                async def abort_attempt(client: Any, item: Any = item) -> None:
                    await client.abort_multipart_upload(
                        Bucket=self.config.bucket, Key=item["Key"], UploadId=item["UploadId"]
                    )

                try:
                    await self.call("AbortMultipartUpload", repr(item["Key"]), abort_attempt)
                except NotFoundError:
                    continue
                self.stats.record("abort_multipart")
                aborted += 1
            if not page.get("IsTruncated"):
                return aborted
            markers = {"KeyMarker": page["NextKeyMarker"], "UploadIdMarker": page["NextUploadIdMarker"]}
