"""Direct ranged GETs (s3stream.storage.s3get) on the real S3 server: the same bytes and the same
errors as botocore's GetObject, transient faults retried, and less client CPU per GET."""

from __future__ import annotations

import os
import statistics
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from s3stream.errors import AccessDeniedError, InvalidArgumentError, NotFoundError
from s3stream.storage.s3 import S3ObjectStorage
from tests.integration.test_storage_s3 import contract_config, wipe
from tests.integration.test_storage_s3_faults import FAST_RETRY
from tests.support.faults import FlakyS3Proxy, ProxyRule
from tests.support.s3 import S3TestServer
from tests.support.storage_contract import payload

pytestmark = pytest.mark.integration

KEY = "seg=1/a+b,c@d!e/f-g_h.i"
"""Every character a key may hold (s3stream.storage.keys) that S3's canonical URI encodes."""
SIZE = 300_000


@pytest.fixture
async def stores(
    s3_server: S3TestServer, s3_prefix: str
) -> AsyncIterator[tuple[S3ObjectStorage, S3ObjectStorage]]:
    config = contract_config(s3_server, s3_prefix)
    direct = S3ObjectStorage(config)
    botocore_only = S3ObjectStorage(replace(config, direct_ranged_gets=False))
    yield direct, botocore_only
    await wipe(botocore_only)
    await direct.close()
    await botocore_only.close()


async def test_ranged_gets_match_botocore(stores: tuple[S3ObjectStorage, S3ObjectStorage]) -> None:
    direct, botocore_only = stores
    data = payload(SIZE, seed=3)
    await direct.put(KEY, data)
    await direct.put("empty", b"")
    await direct.client()
    assert direct._ranged_getter is not None
    await botocore_only.client()
    assert botocore_only._ranged_getter is None
    for start, end in [(0, 1), (0, SIZE), (1000, 9192), (SIZE - 1, SIZE), (SIZE // 2, None), (SIZE, None)]:
        expected = data[start:end]
        assert await direct.get(KEY, start, end) == expected, (start, end)
        assert await botocore_only.get(KEY, start, end) == expected, (start, end)
    assert await direct.get(KEY, 5, 5) == b""
    for store in stores:
        with pytest.raises(NotFoundError):
            await store.get("missing", 0, 10)
        with pytest.raises(InvalidArgumentError, match="beyond"):
            await store.get(KEY, SIZE - 10, SIZE + 10)  # S3 answers the part that exists
        with pytest.raises(InvalidArgumentError):
            await store.get(KEY, SIZE + 1, SIZE + 10)  # 416
        with pytest.raises(InvalidArgumentError):
            await store.get(KEY, SIZE + 1, None)
        assert store.stats.counts["retry"] == 0


async def test_a_wrong_secret_is_access_denied(s3_server: S3TestServer, s3_prefix: str) -> None:
    config = replace(contract_config(s3_server, s3_prefix), secret_key="not-the-secret")
    store = S3ObjectStorage(config)
    try:
        with pytest.raises(AccessDeniedError):
            await store.get("anything", 0, 10)
        assert store._ranged_getter is not None
        assert store.stats.counts["retry"] == 0
    finally:
        await store.close()


async def test_transient_faults_of_ranged_gets_are_retried(s3_server: S3TestServer, s3_prefix: str) -> None:
    proxy = FlakyS3Proxy(s3_server.endpoint)
    endpoint = await proxy.start()
    config = replace(contract_config(s3_server, s3_prefix), retry=FAST_RETRY)
    store = S3ObjectStorage(replace(config, endpoint=endpoint), seed=1)
    truth = S3ObjectStorage(config)
    try:
        data = payload(SIZE, seed=4)
        await truth.put(KEY, data)
        proxy.rules = [
            ProxyRule("503", method="GET", times=1),
            ProxyRule("slowdown", method="GET", times=1),
            ProxyRule("cut_body", method="GET", times=1),
            ProxyRule("reset", method="GET", times=1),
        ]
        assert await store.get(KEY, 100, SIZE) == data[100:]
        assert store._ranged_getter is not None
        assert proxy.faults == {"503": 1, "slowdown": 1, "cut_body": 1, "reset": 1}, proxy.requests
        assert 3 <= store.stats.counts["retry"] <= 4  # (aiohttp may resend on a reset keep-alive socket)
        proxy.rules = [ProxyRule("403", method="GET", times=None)]
        with pytest.raises(AccessDeniedError):
            await store.get(KEY, 0, 10)
    finally:
        await store.close()
        await wipe(truth)
        await truth.close()
        await proxy.close()


def _cpu_s() -> float:
    times = os.times()
    return times.user + times.system


async def test_a_direct_ranged_get_costs_less_client_cpu(
    stores: tuple[S3ObjectStorage, S3ObjectStorage],
) -> None:
    direct, botocore_only = stores
    await direct.put("small", b"s" * 8192)
    rounds: dict[bool, list[float]] = {True: [], False: []}
    for i in range(6):  # alternating, so both meet the same machine load
        for is_direct in (True, False) if i % 2 else (False, True):
            store = direct if is_direct else botocore_only
            started = _cpu_s()
            for _ in range(40):
                assert len(await store.get("small", 0, 8192)) == 8192
            rounds[is_direct].append(_cpu_s() - started)
    direct_s, botocore_s = statistics.median(rounds[True]), statistics.median(rounds[False])
    assert direct_s < 0.7 * botocore_s, (rounds, "direct ranged GETs should cost well under botocore's")
