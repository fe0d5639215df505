"""The S3 client of one bucket: its config, the aiobotocore client, signing, error translation and
retried calls. :class:`S3Client` is the base of :class:`~s3stream.storage.s3.S3ObjectStorage`; the
streamed upload (:mod:`s3stream.storage.s3upload`) works on the same calls without importing the
storage.

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
|                                                   | cannot help, so this is not Unavailable);  |
|                                                   | 403 as its kind AccessDeniedError          |
| transient, still failing at the deadline          | UnavailableError (``retriable`` = True)    |

Payload hashing: SigV4 over plain HTTP signs each body's SHA-256. For bodies of at least
``PREHASH_MIN_BYTES`` the digest is computed once per request in this client's hashing thread
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
import os
import platform
import random
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar

import aiohttp
import botocore.auth
import botocore.exceptions
import botocore.utils
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session

from s3stream.errors import (
    AccessDeniedError,
    ClosedError,
    ConflictError,
    InvalidArgumentError,
    NotFoundError,
    S3StreamError,
    UnavailableError,
)
from s3stream.hooks import call_hook
from s3stream.logfmt import register_secret
from s3stream.storage.base import MAX_PART_SIZE_BYTES, MIN_PART_SIZE_BYTES
from s3stream.storage.keys import validate_key, validate_prefix
from s3stream.storage.retry import RetryPolicy, call_with_retries
from s3stream.storage.s3body import BodyDigests, Piece, digest_pieces, send_pieces_as_views
from s3stream.storage.s3get import RangedGetter, ranged_getter_for
from s3stream.storage.s3quickack import QuickAckSession
from s3stream.storage.stats import StorageStats

T = TypeVar("T")
MiB = 1024 * 1024


class RequestMeter(Protocol):
    """What a metered client reports: each attempt of a call (``op`` as the call names it, e.g.
    ``PUT``, ``CreateMultipartUpload``; ``error`` None on success) and each retry."""

    def attempted(self, op: str, error: BaseException | None, seconds: float) -> None: ...

    def retried(self, op: str) -> None: ...


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
    direct_ranged_gets: bool = True
    """Ranged GETs bypass botocore where :func:`~s3stream.storage.s3get.ranged_getter_for` allows
    (http endpoint, path style, static keys): ~2 ms less client CPU per GET. False: all through botocore."""

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
            return AccessDeniedError(f"{detail}: access denied; check the credentials and bucket policy")
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


class S3Client:
    """One bucket (and optional prefix): the aiobotocore client, created once, and retried calls."""

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
        self._ranged_getter: RangedGetter | None = None
        """Set with the client when the config allows direct ranged GETs (s3stream.storage.s3get)."""
        self.request_meter: RequestMeter | None = None
        """Told of every attempt and retry of every call (metrics); None: nothing."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(bucket={self.config.bucket!r}, prefix={self.config.prefix!r})"

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
            http_session_cls=QuickAckSession,  # no delayed-ACK stalls (s3stream.storage.s3quickack)
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
                    register_secret(secret_key)  # redacted from every log line (s3stream.logfmt)
                    if (access_key is None) != (secret_key is None):
                        access_key = secret_key = None
                    session = get_session()
                    user_agent = (
                        f"s3stream {session.user_agent_name}/{session.user_agent_version} "
                        f"Python/{platform.python_version()}"
                    )
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
                            config=self._client_config(user_agent),
                        )
                        client = await self._stack.enter_async_context(creator)
                        client.meta.events.register("before-send.s3", send_pieces_as_views)
                        for operation in PREHASHED_OPERATIONS:
                            client.meta.events.register(
                                f"choose-signer.s3.{operation}", choose_prehashed_signer
                            )
                        if self.config.direct_ranged_gets:
                            self._ranged_getter = ranged_getter_for(
                                endpoint=self.config.endpoint,
                                path_style=self.config.path_style,
                                bucket=self.config.bucket,
                                region=self.config.region,
                                access_key=access_key,
                                secret_key=secret_key,
                                user_agent=user_agent,
                                connections_max=self.config.inflight_requests_max,
                                connect_timeout_s=self.config.connect_timeout_s,
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
        meter = self.request_meter

        async def one_attempt() -> T:
            async with self._inflight:
                if meter is None:
                    return await attempt(client)
                started_s = time.perf_counter()
                try:
                    result = await attempt(client)
                except BaseException as exc:
                    call_hook("s3.request_meter", meter.attempted, op, exc, time.perf_counter() - started_s)
                    raise
                call_hook("s3.request_meter", meter.attempted, op, None, time.perf_counter() - started_s)
                return result

        def on_retry(error: S3StreamError) -> None:
            self.stats.record("retry")
            if meter is not None:
                call_hook("s3.request_meter.retried", meter.retried, op)

        return await call_with_retries(
            f"{op} {what}",
            one_attempt,
            policy=self.config.retry,
            classify=lambda exc: translate_error(exc, f"{op} {what}"),
            rng=self._rng,
            size_bytes=size_bytes,
            on_retry=on_retry,
        )

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self._stack.aclose()
            self._client = None
            if self._ranged_getter is not None:
                getter, self._ranged_getter = self._ranged_getter, None
                await getter.close()
            if self._hash_executor is not None:
                self._hash_executor.shutdown(wait=False)
                self._hash_executor = None
