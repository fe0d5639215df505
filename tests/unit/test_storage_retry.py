"""The retry loop (backoff, deadline, attempt timeout) and the S3 error translation table."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import socket
import time

import aiohttp
import botocore.exceptions
import pytest

from s3stream.errors import (
    AccessDeniedError,
    ConflictError,
    InvalidArgumentError,
    NotFoundError,
    S3StreamError,
    UnavailableError,
)
from s3stream.storage.base import ObjectStorage
from s3stream.storage.retry import RetryPolicy, call_with_retries
from s3stream.storage.s3client import translate_error

FAST = RetryPolicy(deadline_s=0.5, attempt_timeout_s=0.2, backoff_base_s=0.005, backoff_max_s=0.02)
UNREACHABLE = dataclasses.replace(FAST, deadline_s=3.0)
"""For a refused endpoint: the first attempt also creates the client (botocore's models load then,
which took over 0.5 s on a loaded machine and left no time for a retry). Refusals are immediate, so
the 20 attempts end long before this deadline on an idle machine."""


def client_error(code: str, status: int) -> botocore.exceptions.ClientError:
    return botocore.exceptions.ClientError(
        {"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}}, "PutObject"
    )


def identity(exc: Exception) -> S3StreamError:
    return translate_error(exc, "op")


async def test_transient_failures_are_retried_until_success() -> None:
    calls = 0
    retried: list[S3StreamError] = []

    async def attempt() -> str:
        nonlocal calls
        calls += 1
        if calls < 4:
            raise client_error("SlowDown", 503)
        return "ok"

    result = await call_with_retries(
        "op", attempt, policy=FAST, classify=identity, rng=random.Random(1), on_retry=retried.append
    )
    assert result == "ok"
    assert calls == 4
    assert len(retried) == 3
    assert all(isinstance(e, UnavailableError) for e in retried)


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (client_error("NoSuchKey", 404), NotFoundError),
        (client_error("PreconditionFailed", 412), ConflictError),
        (client_error("AccessDenied", 403), InvalidArgumentError),
        (client_error("InvalidArgument", 400), InvalidArgumentError),
    ],
)
async def test_permanent_failures_are_raised_at_once(exc: Exception, kind: type[Exception]) -> None:
    calls = 0

    async def attempt() -> None:
        nonlocal calls
        calls += 1
        raise exc

    with pytest.raises(kind) as info:
        await call_with_retries("op", attempt, policy=FAST, classify=identity, rng=random.Random(1))
    assert calls == 1
    assert info.value.__cause__ is exc


async def test_the_deadline_bounds_a_call_that_always_fails() -> None:
    calls = 0

    async def attempt() -> None:
        nonlocal calls
        calls += 1
        raise ConnectionResetError("reset by peer")

    started = time.monotonic()
    with pytest.raises(UnavailableError, match="gave up after") as info:
        await call_with_retries("op", attempt, policy=FAST, classify=identity, rng=random.Random(2))
    elapsed_s = time.monotonic() - started
    assert elapsed_s < FAST.deadline_s + 0.1
    assert calls > 3
    assert info.value.retriable
    assert isinstance(info.value.__cause__, ConnectionResetError)


async def test_each_attempt_runs_under_a_timeout() -> None:
    calls = 0

    async def attempt() -> None:
        nonlocal calls
        calls += 1
        await asyncio.sleep(10)

    started = time.monotonic()
    with pytest.raises(UnavailableError, match="TimeoutError"):
        await call_with_retries("op", attempt, policy=FAST, classify=identity, rng=random.Random(3))
    assert time.monotonic() - started < FAST.deadline_s + 0.1
    assert calls >= 2


async def test_attempt_budget_is_respected() -> None:
    calls = 0

    async def attempt() -> None:
        nonlocal calls
        calls += 1
        raise client_error("InternalError", 500)

    policy = RetryPolicy(deadline_s=10, attempts_max=3, backoff_base_s=0.001, backoff_max_s=0.001)
    with pytest.raises(UnavailableError, match="3 attempts"):
        await call_with_retries("op", attempt, policy=policy, classify=identity, rng=random.Random(4))
    assert calls == 3


def test_backoff_is_jittered_exponential_and_capped() -> None:
    policy = RetryPolicy(backoff_base_s=0.1, backoff_max_s=1.0)
    rng = random.Random(5)
    for retry_index in range(12):
        ceiling = min(1.0, 0.1 * 2**retry_index)
        samples = [policy.backoff_s(retry_index, rng) for _ in range(50)]
        assert all(0 <= s <= ceiling for s in samples)
        assert max(samples) > ceiling / 2
    assert [policy.backoff_s(3, random.Random(9)) for _ in range(2)] == [
        policy.backoff_s(3, random.Random(9))
    ] * 2


def test_budgets_grow_with_payload_size() -> None:
    policy = RetryPolicy(deadline_s=30, attempt_timeout_s=10, slow_link_bytes_per_s=1024)
    assert policy.budgets_s(0) == (30, 10)
    assert policy.budgets_s(10 * 1024) == (40, 20)


@pytest.mark.parametrize(
    "kwargs", [{"deadline_s": 0}, {"attempt_timeout_s": -1}, {"attempts_max": 0}, {"backoff_max_s": 0.001}]
)
def test_bad_policies_are_rejected(kwargs: dict[str, float]) -> None:
    with pytest.raises(InvalidArgumentError):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("exc", "kind", "retriable"),
    [
        (client_error("NoSuchKey", 404), NotFoundError, False),
        (client_error("404", 404), NotFoundError, False),
        (client_error("NoSuchBucket", 404), NotFoundError, False),
        (client_error("NoSuchUpload", 404), NotFoundError, False),
        (client_error("PreconditionFailed", 412), ConflictError, False),
        (client_error("InvalidRange", 416), InvalidArgumentError, False),
        (client_error("AccessDenied", 403), AccessDeniedError, False),
        (client_error("SignatureDoesNotMatch", 403), AccessDeniedError, False),
        (client_error("EntityTooSmall", 400), InvalidArgumentError, False),
        (client_error("RequestTimeout", 400), UnavailableError, True),
        (client_error("SlowDown", 503), UnavailableError, True),
        (client_error("ServiceUnavailable", 503), UnavailableError, True),
        (client_error("InternalError", 500), UnavailableError, True),
        (client_error("", 502), UnavailableError, True),
        (client_error("TooManyRequests", 429), UnavailableError, True),
        (client_error("ConditionalRequestConflict", 409), UnavailableError, True),
        (TimeoutError(), UnavailableError, True),
        (ConnectionResetError(), UnavailableError, True),
        (aiohttp.ServerDisconnectedError(), UnavailableError, True),
        (aiohttp.ClientPayloadError("cut"), UnavailableError, True),
        (botocore.exceptions.ReadTimeoutError(endpoint_url="http://x"), UnavailableError, True),
        (botocore.exceptions.EndpointConnectionError(endpoint_url="http://x"), UnavailableError, True),
        (botocore.exceptions.ConnectionClosedError(endpoint_url="http://x"), UnavailableError, True),
        (botocore.exceptions.NoCredentialsError(), InvalidArgumentError, False),
        (botocore.exceptions.ParamValidationError(report="bad"), InvalidArgumentError, False),
    ],
)
def test_error_translation_table(exc: Exception, kind: type[S3StreamError], retriable: bool) -> None:
    error = translate_error(exc, "GET 'k'")
    assert type(error) is kind
    assert error.retriable is retriable
    assert "GET 'k'" in str(error)


@pytest.mark.parametrize("code", ["AccessDenied", "SignatureDoesNotMatch", "InvalidAccessKeyId"])
def test_forbidden_tells_the_caller_to_check_credentials(code: str) -> None:
    error = translate_error(client_error(code, 403), "GET 'k'")
    assert type(error) is AccessDeniedError  # a kind of InvalidArgumentError
    assert isinstance(error, InvalidArgumentError)
    assert "check the credentials and bucket policy" in str(error)


def test_programming_errors_are_not_translated() -> None:
    with pytest.raises(TypeError):
        translate_error(TypeError("bug"), "op")


async def test_unusable_client_configuration_is_an_invalid_argument() -> None:
    from s3stream.storage.s3 import S3Config, S3ObjectStorage

    store = S3ObjectStorage(S3Config(bucket="b", endpoint="http://[bad", access_key="a", secret_key="s"))
    with pytest.raises(InvalidArgumentError, match="S3 client"):
        await store.head("k")
    await store.close()


async def _one_call(store: ObjectStorage, op: str) -> None:
    if op == "put":
        await store.put("k", b"data")
    elif op == "get":
        await store.get("k", 0, 4)
    elif op == "head":
        await store.head("k")
    elif op == "list":
        _ = [info async for info in store.list("")]
    else:
        upload = store.upload("k")
        await upload.write(b"data")
        await upload.complete()


@pytest.mark.parametrize("op", ["put", "get", "head", "list", "upload"])
async def test_unreachable_endpoint_is_unavailable_within_the_deadline(op: str) -> None:
    from s3stream.storage.s3 import S3Config, S3ObjectStorage

    with socket.socket() as probe:  # a port nobody listens on: every connection is refused
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = S3Config(
        bucket="b",
        endpoint=f"http://127.0.0.1:{port}",
        path_style=True,
        access_key="a",
        secret_key="s",
        retry=UNREACHABLE,
    )
    store = S3ObjectStorage(config, seed=1)
    started = time.monotonic()
    try:
        with pytest.raises(UnavailableError, match="gave up after") as info:
            await _one_call(store, op)
        assert info.value.retriable
        assert store.stats.counts["retry"] >= 1  # transient: retried until the deadline
    finally:
        await store.close()
    # the margin covers the client's creation (botocore's models load on the first call; seconds on
    # a loaded machine): retrying past the deadline would take far longer
    assert time.monotonic() - started < UNREACHABLE.deadline_s + 5.0
