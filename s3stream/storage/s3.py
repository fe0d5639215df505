"""S3ObjectStorage: the ObjectStorage protocol over S3 (AWS, MinIO, Ceph RGW) through aiobotocore.

Requests: single PutObject up to ``multipart_threshold_bytes`` (32 MiB; a streamed upload stages at
most ``part_concurrency_max * part_size_bytes`` of it), multipart above it with parts of
``part_size_bytes`` (>= 5 MiB) uploaded concurrently (at most ``part_concurrency_max`` per upload,
which bounds an upload's buffers, see :mod:`s3stream.storage.s3upload`); ranged GetObject; HeadObject; DeleteObjects in batches of <= 1000 keys; ListObjectsV2 by
prefix, ``list_page_size`` keys per page; UploadPartCopy for copied ranges of >= 5 MiB (AutoMQ's
rules, see :mod:`s3stream.storage.s3upload`); conditional create with ``If-None-Match: *``. At most
``inflight_requests_max`` requests are on the wire at once; every attempt runs under a timeout.

Retries (:mod:`s3stream.storage.retry`): botocore's own retries are off; ours retry transient
failures (HTTP 5xx, 408, 429, SlowDown, InternalError, RequestTimeout, timeouts, connection resets,
truncated bodies) with jittered exponential backoff until ``RetryPolicy.deadline_s`` and never retry
permanent ones. Errors are translated here, at the boundary:

| S3 / transport                                    | raised                                     |
|---------------------------------------------------|--------------------------------------------|
| 404, NoSuchKey, NoSuchBucket, NoSuchUpload        | NotFoundError                              |
| 412 PreconditionFailed (lost conditional create)  | ConflictError                              |
| 416, range past the end                           | InvalidArgumentError                       |
| 403 AccessDenied, bad signature, other 4xx        | InvalidArgumentError (fix the credentials, |
|   NoCredentials, parameter validation             | bucket policy or configuration: a retry    |
|                                                   | cannot help, so this is not Unavailable)   |
| transient, still failing at the deadline          | UnavailableError (``retriable`` = True)    |

The ETag of CompleteMultipartUpload is never used (Ceph 16 returns an empty one). A conditional
PUT that meets 412 checks whether the stored object is its own (same size and MD5 ETag): an earlier
attempt that succeeded but whose answer was lost is a win, not a conflict. (A rival that wrote the
very same bytes is indistinguishable, and harmless: callers put a unique owner id in the body.)

Payload hashing: SigV4 over plain HTTP signs each body's SHA-256. For bodies of at least
``PREHASH_MIN_BYTES`` the digest is computed once per request in this storage's hashing thread
(``hashlib`` releases the GIL) and given to botocore through a signer that takes it instead of reading
and hashing the body on the event loop (PutObject and UploadPart only; the signature is the same).

Credentials: ``access_key``/``secret_key`` of the config (URI), else ``KAFKA_S3_ACCESS_KEY`` /
``KAFKA_S3_SECRET_KEY`` as AutoMQ, else botocore's chain (``AWS_ACCESS_KEY_ID``..., profiles, IMDS).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime
import functools
import hashlib
import os
import platform
import random
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import aiohttp
import botocore.auth
import botocore.exceptions
import botocore.utils
from aiobotocore.config import AioConfig
from aiobotocore.response import AioStreamingBody
from aiobotocore.session import get_session

from s3stream.errors import (
    ClosedError,
    ConflictError,
    InvalidArgumentError,
    NotFoundError,
    S3StreamError,
    UnavailableError,
)
from s3stream.storage.base import (
    MAX_DELETE_BATCH,
    MAX_PART_SIZE_BYTES,
    MIN_PART_SIZE_BYTES,
    ObjectInfo,
    Upload,
)
from s3stream.storage.keys import resolve_range, validate_key, validate_prefix, validate_range
from s3stream.storage.retry import RetryPolicy, call_with_retries
from s3stream.storage.s3body import (
    BodyDigests,
    Piece,
    PiecesReader,
    digest_params,
    digest_pieces,
    send_pieces_as_views,
)
from s3stream.storage.stats import StorageStats

T = TypeVar("T")
MiB = 1024 * 1024

TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "InternalError",
        "ServiceUnavailable",
        "RequestTimeout",
        "OperationAborted",
        "Throttling",
        "ThrottlingException",
        "TooManyRequests",
        "RequestLimitExceeded",
        "ConditionalRequestConflict",
        "BadDigest",
        "XAmzContentSHA256Mismatch",
    }
)
"""S3 error codes worth retrying (also used for per-key DeleteObjects errors)."""
TRANSIENT_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
NOT_FOUND_CODES = frozenset({"NoSuchKey", "NotFound", "404", "NoSuchBucket", "NoSuchUpload"})

ChecksumMode = Literal["when_supported", "when_required"]

PREHASH_MIN_BYTES = 256 * 1024
"""Bodies at least this large are hashed in the hashing thread (smaller ones: not worth the hop)."""
PREHASHED_SIGNER = "s3v4-s3stream-prehashed"
"""botocore signature version name of :class:`PrehashedS3SigV4Auth`."""


class PrehashedS3SigV4Auth(botocore.auth.S3SigV4Auth):  # type: ignore[misc]
    """botocore's S3 SigV4 signer, taking the payload SHA-256 from ``PiecesReader.sha256_hex`` when
    the body carries one (computed off the event loop) instead of reading and hashing the body."""

    def payload(self, request: Any) -> str:
        digest = getattr(request.body, "sha256_hex", None)
        if (
            isinstance(digest, str)
            and not self._is_streaming_checksum_payload(request)
            and self._should_sha256_sign_payload(request)
        ):
            return digest
        return str(super().payload(request))


botocore.auth.AUTH_TYPE_MAPS.setdefault(PREHASHED_SIGNER, PrehashedS3SigV4Auth)


def choose_prehashed_signer(signature_version: Any = None, **_: Any) -> str | None:
    """``choose-signer.s3.<op>`` handler (runs before botocore's generic ones): S3 SigV4 requests of
    the operations that send our bodies use :class:`PrehashedS3SigV4Auth`; anything else is left as is."""
    return PREHASHED_SIGNER if signature_version == "s3v4" else None


PREHASHED_OPERATIONS = ("PutObject", "UploadPart")

_RFC1123_RE = re.compile(r"[A-Z][a-z]{2}, (\d\d) ([A-Z][a-z]{2}) (\d{4}) (\d\d):(\d\d):(\d\d) GMT")
_ISO8601_UTC_RE = re.compile(r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?Z")
_MONTHS = {
    name: number
    for number, name in enumerate(
        ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), 1
    )
}


def parse_s3_timestamp(value: Any) -> datetime.datetime:
    """botocore's response timestamp parser, with a fast path for the two forms S3 sends:
    RFC 1123 in headers (``Last-Modified: Sun, 22 Nov 2026 11:21:18 GMT``) and ISO 8601 UTC in XML
    (``<LastModified>2026-11-22T11:21:18.000Z``). botocore's default hands every timestamp to
    dateutil (~100 us of CPU each on HEAD and GET); anything else still goes there."""
    if isinstance(value, str):
        if match := _RFC1123_RE.fullmatch(value):
            day, month_name, year, hour, minute, second = match.groups()
            month = _MONTHS.get(month_name)
            if month is not None:
                try:
                    return datetime.datetime(
                        int(year), month, int(day), int(hour), int(minute), int(second), tzinfo=datetime.UTC
                    )
                except ValueError:
                    pass
        elif match := _ISO8601_UTC_RE.fullmatch(value):
            year, month_text, day, hour, minute, second, fraction = match.groups()
            try:
                return datetime.datetime(
                    int(year),
                    int(month_text),
                    int(day),
                    int(hour),
                    int(minute),
                    int(second),
                    int(fraction.ljust(6, "0")) if fraction else 0,
                    tzinfo=datetime.UTC,
                )
            except ValueError:
                pass
    return botocore.utils.parse_timestamp(value)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class S3Config:
    """Everything needed to reach one bucket; built from a bucket URI by :mod:`s3stream.storage.uri`."""

    bucket: str
    endpoint: str | None = None
    region: str = "us-east-1"
    path_style: bool = False
    access_key: str | None = None
    secret_key: str | None = field(default=None, repr=False)
    prefix: str = ""
    """Every key lives under this sub-prefix (normalised to end with ``/``)."""
    checksum_mode: ChecksumMode = "when_supported"
    """botocore's request_checksum_calculation / response_checksum_validation; ``when_required`` for
    older servers that reject flexible checksums."""
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    multipart_threshold_bytes: int = 32 * MiB
    part_size_bytes: int = 16 * MiB
    part_concurrency_max: int = 4
    inflight_requests_max: int = 64
    list_page_size: int = 1000
    connect_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        if not self.bucket:
            raise InvalidArgumentError("S3 bucket name is empty")
        if self.prefix:
            prefix = self.prefix if self.prefix.endswith("/") else self.prefix + "/"
            try:
                validate_prefix(prefix)
            except InvalidArgumentError as exc:
                raise InvalidArgumentError(f"S3 key prefix {self.prefix!r} is not valid: {exc}") from None
            object.__setattr__(self, "prefix", prefix)
        if self.checksum_mode not in ("when_supported", "when_required"):
            raise InvalidArgumentError(
                f"checksum mode must be when_supported or when_required: {self.checksum_mode!r}"
            )
        if not MIN_PART_SIZE_BYTES <= self.part_size_bytes <= MAX_PART_SIZE_BYTES:
            raise InvalidArgumentError(f"part size must be in [5 MiB, 5 GiB], got {self.part_size_bytes}")
        if not 0 <= self.multipart_threshold_bytes <= MAX_PART_SIZE_BYTES:
            raise InvalidArgumentError(f"multipart threshold out of range: {self.multipart_threshold_bytes}")
        if min(self.part_concurrency_max, self.inflight_requests_max, self.list_page_size) < 1:
            raise InvalidArgumentError("concurrency limits and list page size must be >= 1")
        if self.list_page_size > 1000:
            raise InvalidArgumentError("list page size must be <= 1000 (S3's maximum)")
        if (self.access_key is None) != (self.secret_key is None):
            raise InvalidArgumentError("give both accessKey and secretKey, or neither")


def _client_error_details(exc: botocore.exceptions.ClientError) -> tuple[str, int]:
    error = exc.response.get("Error", {})
    status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    return str(error.get("Code", "")), status


def translate_error(exc: Exception, what: str) -> S3StreamError:
    """Map one botocore/aiohttp/OS exception to our error kind (see the module docstring)."""
    if isinstance(exc, S3StreamError):
        return exc
    if isinstance(exc, botocore.exceptions.ClientError):
        code, status = _client_error_details(exc)
        detail = f"{what}: {code or status} (HTTP {status})"
        if code in NOT_FOUND_CODES or status == 404:
            return NotFoundError(f"{detail}: not found")
        if code == "PreconditionFailed" or status == 412:
            return ConflictError(f"{detail}: precondition failed (object exists)")
        if code in TRANSIENT_CODES or status in TRANSIENT_STATUSES or status >= 500:
            return UnavailableError(detail)
        if code == "InvalidRange" or status == 416:
            return InvalidArgumentError(f"{detail}: range not satisfiable")
        if status == 403:
            return InvalidArgumentError(f"{detail}: access denied; check the credentials and bucket policy")
        return InvalidArgumentError(detail)
    if isinstance(exc, (botocore.exceptions.NoCredentialsError, botocore.exceptions.PartialCredentialsError)):
        return InvalidArgumentError(f"{what}: no usable S3 credentials ({exc})")
    if isinstance(exc, (botocore.exceptions.ParamValidationError, botocore.exceptions.InvalidConfigError)):
        return InvalidArgumentError(f"{what}: {exc}")
    if isinstance(
        exc,
        (
            TimeoutError,
            botocore.exceptions.HTTPClientError,
            botocore.exceptions.ConnectionError,
            botocore.exceptions.ResponseStreamingError,
            botocore.exceptions.IncompleteReadError,
            botocore.exceptions.FlexibleChecksumError,
            aiohttp.ClientError,
            ConnectionError,
            OSError,
        ),
    ):
        return UnavailableError(f"{what}: {type(exc).__name__}: {exc}")
    if isinstance(exc, botocore.exceptions.BotoCoreError):
        error = UnavailableError(f"{what}: {type(exc).__name__}: {exc}")
        error.retriable = False
        return error
    raise exc  # a bug, not a storage condition: let it surface unchanged


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
    expected = None if content_length is None else int(str(content_length))
    if expected is not None:
        raise_limit(expected)  # as read() does: no pausing the socket midway
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk, end_of_http_chunk = await content.readchunk()
        if chunk:
            chunks.append(chunk)
            size += len(chunk)
        elif not end_of_http_chunk:
            break  # (b"", False): the end of the body
    if expected is not None and size != expected:
        raise botocore.exceptions.IncompleteReadError(actual_bytes=size, expected_bytes=expected)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _etag(raw: object) -> str:
    return str(raw or "").strip('"')


class S3ObjectStorage:
    """One bucket (and optional prefix) of an S3-compatible store; see the module docstring."""

    def __init__(self, config: S3Config, *, seed: int | None = None) -> None:
        self.config = config
        self.stats = StorageStats()
        self._rng = random.Random(seed)
        self._inflight = asyncio.Semaphore(config.inflight_requests_max)
        self._client: Any = None
        self._client_lock = asyncio.Lock()
        self._stack = AsyncExitStack()
        self._closed = False
        self._hash_executor: concurrent.futures.ThreadPoolExecutor | None = None

    def __repr__(self) -> str:
        return f"S3ObjectStorage(bucket={self.config.bucket!r}, prefix={self.config.prefix!r})"

    # -- plumbing ----------------------------------------------------------------------------

    def _client_config(self, user_agent: str) -> AioConfig:
        """``user_agent`` is a fixed string: without it botocore rebuilds the agent (with per-request
        feature metadata) twice for every request, ~7 % of a small request's CPU."""
        config = self.config
        return AioConfig(
            signature_version="s3v4",
            user_agent=user_agent,
            s3={"addressing_style": "path" if config.path_style else "auto"},
            retries={"total_max_attempts": 1, "mode": "standard"},
            connect_timeout=config.connect_timeout_s,
            read_timeout=config.retry.attempt_timeout_s,
            max_pool_connections=config.inflight_requests_max,
            request_checksum_calculation=config.checksum_mode,
            response_checksum_validation=config.checksum_mode,
        )

    async def connect(self) -> None:
        """Create the client now (botocore's models and the client are ~60,000 Python objects and
        tens of ms of CPU): the assembly calls this while it opens the engine, so that start-up work
        is not done at the first upload, in the middle of appends, and the objects exist before an
        application freezes its start-up heap (:func:`s3stream.heap.freeze_startup_heap`)."""
        await self.client()

    async def check_access(self) -> S3StreamError | None:
        """One ListObjectsV2 of a single key under the prefix, no retries: the bucket exists and the
        credentials may list it (the engine lists, reads, writes and deletes there).

        Raises a permanent failure (NotFoundError: no such bucket; InvalidArgumentError: credentials,
        policy or configuration); returns a transient one (UnavailableError: unreachable, timing
        out, 5xx) for the caller to report; None when storage answered.
        """
        client = await self.client()
        what = f"LIST s3://{self.config.bucket}/{self.config.prefix}"
        try:
            async with asyncio.timeout(self.config.connect_timeout_s + self.config.retry.attempt_timeout_s):
                await client.list_objects_v2(Bucket=self.config.bucket, Prefix=self.config.prefix, MaxKeys=1)
        except Exception as exc:
            error = translate_error(exc, what)
            if error.retriable:
                return error
            raise error from exc
        return None

    async def client(self) -> Any:
        """The aiobotocore client, created on first use (or by :meth:`connect`)."""
        if self._closed:
            raise ClosedError(f"{self!r} is closed")
        if self._client is None:
            async with self._client_lock:
                if self._client is None:
                    access_key = self.config.access_key or os.environ.get("KAFKA_S3_ACCESS_KEY")
                    secret_key = self.config.secret_key or os.environ.get("KAFKA_S3_SECRET_KEY")
                    if (access_key is None) != (secret_key is None):
                        access_key = secret_key = None
                    session = get_session()
                    session.get_component("response_parser_factory").set_parser_defaults(
                        timestamp_parser=parse_s3_timestamp
                    )
                    try:
                        creator = session.create_client(
                            "s3",
                            endpoint_url=self.config.endpoint,
                            region_name=self.config.region,
                            aws_access_key_id=access_key,
                            aws_secret_access_key=secret_key,
                            config=self._client_config(
                                f"s3stream {session.user_agent_name}/{session.user_agent_version} "
                                f"Python/{platform.python_version()}"
                            ),
                        )
                        client = await self._stack.enter_async_context(creator)
                        client.meta.events.register("before-send.s3", send_pieces_as_views)
                        for operation in PREHASHED_OPERATIONS:
                            client.meta.events.register(
                                f"choose-signer.s3.{operation}", choose_prehashed_signer
                            )
                        self._client = client
                    except (ValueError, botocore.exceptions.BotoCoreError) as exc:
                        raise InvalidArgumentError(f"cannot create an S3 client for {self!r}: {exc}") from exc
        return self._client

    def full_key(self, key: str) -> str:
        return self.config.prefix + validate_key(key)

    async def body_digests(self, pieces: Sequence[Piece], size_bytes: int) -> BodyDigests | None:
        """SHA-256 (and with flexible checksums on, CRC32) of a request body of at least
        ``PREHASH_MIN_BYTES``, computed in the hashing thread; None for smaller bodies (botocore
        hashes those itself)."""
        if size_bytes < PREHASH_MIN_BYTES:
            return None
        if self._hash_executor is None:
            self._hash_executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="s3stream-s3-hash"
            )
        job = functools.partial(
            digest_pieces, tuple(pieces), crc32=self.config.checksum_mode == "when_supported"
        )
        return await asyncio.get_running_loop().run_in_executor(self._hash_executor, job)

    async def call(
        self, op: str, what: str, attempt: Callable[[Any], Awaitable[T]], *, size_bytes: int = 0
    ) -> T:
        """Run ``attempt(client)`` with retries, each attempt holding one in-flight slot."""
        client = await self.client()

        async def one_attempt() -> T:
            async with self._inflight:
                return await attempt(client)

        def on_retry(error: S3StreamError) -> None:
            self.stats.record("retry")

        return await call_with_retries(
            f"{op} {what}",
            one_attempt,
            policy=self.config.retry,
            classify=lambda exc: translate_error(exc, f"{op} {what}"),
            rng=self._rng,
            size_bytes=size_bytes,
            on_retry=on_retry,
        )

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

    def upload(self, key: str, *, buffer_max_bytes: int | None = None) -> Upload:
        """See :class:`~s3stream.storage.s3upload.S3Upload`; ``buffer_max_bytes`` picks smaller or
        fewer parts in flight (:func:`~s3stream.storage.s3upload.upload_shape`)."""
        from s3stream.storage.s3upload import S3Upload

        full = self.full_key(key)
        if self._closed:
            raise ClosedError(f"{self!r} is closed")
        return S3Upload(self, key, full, buffer_max_bytes=buffer_max_bytes)

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

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self._stack.aclose()
            self._client = None
            if self._hash_executor is not None:
                self._hash_executor.shutdown(wait=False)
                self._hash_executor = None
