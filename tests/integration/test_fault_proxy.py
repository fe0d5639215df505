"""The fault proxy (benchmarks/fault_proxy.py) in front of the Ceph RGW: S3 calls through it work
(signatures included), and each fault mode does what it says."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.exceptions import ClientError

from benchmarks.fault_proxy import FaultProxy
from tests.support.fault_proxy import proxied
from tests.support.s3 import S3TestServer

MiB = 1024 * 1024
StartProxy = Callable[[], FaultProxy]
SAMPLE_AFTER_S = 0.5
"""The throttle test samples the proxy's counters from this long after a transfer starts ..."""
SAMPLE_FOR_S = 2.5
"""... for this long (a 16 MiB transfer at 4 MiB/s lasts 4 s)."""


@asynccontextmanager
async def raw_client(
    server: S3TestServer, proxy: FaultProxy, *, timeout_s: float = 30.0
) -> AsyncIterator[Any]:
    """A plain aiobotocore client through ``proxy``: one attempt per call, ``timeout_s`` per read."""
    config = AioConfig(
        s3={"addressing_style": "path"},
        connect_timeout=timeout_s,
        read_timeout=timeout_s,
        retries={"total_max_attempts": 1},
    )
    async with get_session().create_client(
        "s3",
        endpoint_url=proxy.endpoint,
        region_name=server.region,
        aws_access_key_id=server.access_key,
        aws_secret_access_key=server.secret_key,
        config=config,
    ) as client:
        yield client


async def test_s3_calls_through_the_proxy_work(
    s3_server: S3TestServer, s3_prefix: str, fault_proxies: StartProxy
) -> None:
    proxy = fault_proxies()
    storage = proxied(s3_server, proxy).storage(
        s3_prefix, multipart_threshold_bytes=8 * MiB, part_size_bytes=5 * MiB
    )
    small = os.urandom(1000)
    big = os.urandom(12 * MiB)  # multipart: 3 parts
    try:
        await storage.put("small", small)
        await storage.put("big", big)
        assert await storage.get("small") == small
        assert await storage.get("big") == big
        assert await storage.get("big", 5 * MiB, 5 * MiB + 10) == big[5 * MiB : 5 * MiB + 10]
        assert (await storage.head("big")).size_bytes == len(big)
        assert [info.key async for info in storage.list("")] == ["big", "small"]
        await storage.delete(["small", "big"])
        assert [info.key async for info in storage.list("")] == []
    finally:
        await storage.close()
    state = proxy.state()
    assert state["mode"] == "forward"
    assert state["bytes_up"] >= len(big) + len(small)
    assert state["bytes_down"] >= len(big) + len(small)


async def test_a_bad_signature_is_still_refused_through_the_proxy(
    s3_server: S3TestServer, s3_prefix: str, fault_proxies: StartProxy
) -> None:
    """The proxy forwards what the client signed: the server checks it, so a wrong key fails."""
    proxy = fault_proxies()
    wrong = S3TestServer(
        proxy.endpoint, s3_server.access_key, "not-the-secret", s3_server.bucket, s3_server.region
    )
    async with raw_client(wrong, proxy) as client:
        with pytest.raises(ClientError) as caught:
            await client.put_object(Bucket=s3_server.bucket, Key=s3_prefix + "x", Body=b"x")
    assert caught.value.response["Error"]["Code"] == "SignatureDoesNotMatch"


async def test_blackhole_never_answers_and_heal_forwards_again(
    s3_server: S3TestServer, s3_prefix: str, fault_proxies: StartProxy
) -> None:
    proxy = fault_proxies()
    async with raw_client(s3_server, proxy, timeout_s=1.0) as client:
        await client.put_object(Bucket=s3_server.bucket, Key=s3_prefix + "k", Body=b"v")
        assert (await asyncio.to_thread(proxy.blackhole))["mode"] == "blackhole"
        started = time.monotonic()
        with pytest.raises(Exception, match="Read timeout"):
            await client.get_object(Bucket=s3_server.bucket, Key=s3_prefix + "k")
        assert time.monotonic() - started >= 0.9  # it waited for the client's timeout
        await asyncio.to_thread(proxy.heal)
        response = await client.get_object(Bucket=s3_server.bucket, Key=s3_prefix + "k")
        async with response["Body"] as body:
            assert await body.read() == b"v"


async def test_refuse_closes_connections_and_heal_forwards_again(
    s3_server: S3TestServer, s3_prefix: str, fault_proxies: StartProxy
) -> None:
    proxy = fault_proxies()
    async with raw_client(s3_server, proxy, timeout_s=10.0) as client:
        await client.put_object(Bucket=s3_server.bucket, Key=s3_prefix + "k", Body=b"v")
        await asyncio.to_thread(proxy.refuse)
        started = time.monotonic()
        with pytest.raises(Exception, match=r"(?i)connection|disconnect"):
            await client.get_object(Bucket=s3_server.bucket, Key=s3_prefix + "k")
        assert time.monotonic() - started < 5.0  # closed at once, not timed out
        await asyncio.to_thread(proxy.heal)
        response = await client.get_object(Bucket=s3_server.bucket, Key=s3_prefix + "k")
        async with response["Body"] as body:
            assert await body.read() == b"v"


async def test_error_answers_every_request_with_the_status(
    s3_server: S3TestServer, s3_prefix: str, fault_proxies: StartProxy
) -> None:
    proxy = fault_proxies()
    async with raw_client(s3_server, proxy) as client:
        await asyncio.to_thread(proxy.error, 503)
        with pytest.raises(ClientError) as caught:
            await client.put_object(Bucket=s3_server.bucket, Key=s3_prefix + "k", Body=b"v" * 100_000)
        assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
        assert caught.value.response["Error"]["Code"] == "ServiceUnavailable"
        await asyncio.to_thread(proxy.error, 500)
        with pytest.raises(ClientError) as caught:
            await client.head_object(Bucket=s3_server.bucket, Key=s3_prefix + "k")
        assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 500
        await asyncio.to_thread(proxy.heal)
        with pytest.raises(ClientError) as caught:  # the PUT never reached the server
            await client.head_object(Bucket=s3_server.bucket, Key=s3_prefix + "k")
        assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404


async def test_throttle_holds_each_direction_to_the_rate(
    s3_server: S3TestServer, s3_prefix: str, fault_proxies: StartProxy
) -> None:
    """While bodies flow through a throttled proxy, each direction moves at the rate within 10 %
    (the proxy's byte counts sampled mid-transfer); end to end, with the server's own time, within 20 %."""
    proxy = fault_proxies()
    rate_bytes_per_s = 4 * MiB
    body = os.urandom(16 * MiB)
    async with raw_client(s3_server, proxy) as client:
        await client.put_object(Bucket=s3_server.bucket, Key=s3_prefix + "warm", Body=b"w")
        state = await asyncio.to_thread(proxy.throttle, rate_bytes_per_s)
        assert state["bytes_per_s"] == rate_bytes_per_s

        async def put_both() -> None:
            await asyncio.gather(
                *(
                    client.put_object(Bucket=s3_server.bucket, Key=s3_prefix + f"o{i}", Body=body[i::2])
                    for i in (0, 1)
                )
            )

        async def get_both() -> None:
            for i in (0, 1):
                response = await client.get_object(Bucket=s3_server.bucket, Key=s3_prefix + f"o{i}")
                async with response["Body"] as stream:
                    assert await stream.read() == body[i::2]

        rates: dict[str, tuple[float, float]] = {}
        for name, counter, transfer in (("put", "bytes_up", put_both), ("get", "bytes_down", get_both)):
            started = time.monotonic()
            task = asyncio.get_running_loop().create_task(transfer())
            await asyncio.sleep(SAMPLE_AFTER_S)
            first, first_s = (await asyncio.to_thread(proxy.state))[counter], time.monotonic()
            await asyncio.sleep(SAMPLE_FOR_S)
            last, last_s = (await asyncio.to_thread(proxy.state))[counter], time.monotonic()
            await task
            rates[name] = ((last - first) / (last_s - first_s), len(body) / (time.monotonic() - started))
    print(f"throttle {rate_bytes_per_s / MiB:.1f} MiB/s: " + ", ".join(
        f"{name} {mid / MiB:.2f} mid-transfer, {whole / MiB:.2f} end to end" for name, (mid, whole) in rates.items()
    ))  # fmt: skip
    for mid_bytes_per_s, whole_bytes_per_s in rates.values():
        assert abs(mid_bytes_per_s - rate_bytes_per_s) <= 0.1 * rate_bytes_per_s
        assert abs(whole_bytes_per_s - rate_bytes_per_s) <= 0.2 * rate_bytes_per_s


def test_control_refuses_unknown_actions_and_bad_rates(fault_proxies: StartProxy) -> None:
    proxy = fault_proxies()
    with pytest.raises(Exception, match=r"HTTP Error 404"):
        proxy._call("explode")
    with pytest.raises(Exception, match=r"HTTP Error 400"):
        proxy.throttle(-1)
    assert proxy.state()["mode"] == "forward"
