"""The S3 backend against real transport failures: a flaky proxy in front of the real server.

Shows that transient failures (503, SlowDown, 500, 429, connection resets, bodies cut short, lost
replies) are retried until they succeed, that the overall deadline is respected, that permanent
failures (403, 404, 412) are not retried, and that a multipart upload failing mid-way is aborted and
leaves nothing visible.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

import pytest

from s3stream.errors import ConflictError, InvalidArgumentError, NotFoundError, UnavailableError
from s3stream.storage.base import MIN_PART_SIZE_BYTES
from s3stream.storage.retry import RetryPolicy
from s3stream.storage.s3 import S3ObjectStorage
from tests.integration.test_storage_s3 import contract_config, wipe
from tests.support.faults import FlakyS3Proxy, ProxyRule
from tests.support.s3 import S3TestServer
from tests.support.storage_contract import keys_of, payload

pytestmark = pytest.mark.integration

FAST_RETRY = RetryPolicy(deadline_s=10, attempt_timeout_s=5, backoff_base_s=0.01, backoff_max_s=0.1)


@dataclass
class Rig:
    proxy: FlakyS3Proxy
    storage: S3ObjectStorage
    direct: S3ObjectStorage
    """The same bucket and prefix without the proxy: the ground truth."""


@pytest.fixture
async def rig(s3_server: S3TestServer, s3_prefix: str) -> AsyncIterator[Rig]:
    proxy = FlakyS3Proxy(s3_server.endpoint)
    endpoint = await proxy.start()
    config = replace(contract_config(s3_server, s3_prefix), retry=FAST_RETRY, inflight_requests_max=8)
    storage = S3ObjectStorage(replace(config, endpoint=endpoint), seed=1)
    direct = S3ObjectStorage(config)
    yield Rig(proxy, storage, direct)
    await storage.close()
    await wipe(direct)
    await direct.close()
    await proxy.close()


async def test_transient_errors_are_retried_until_success(rig: Rig) -> None:
    rig.proxy.rules = [
        ProxyRule("503", method="PUT", times=1),
        ProxyRule("slowdown", method="PUT", times=1),
        ProxyRule("500", method="PUT", times=1),
        ProxyRule("429", method="PUT", times=1),
        ProxyRule("reset", method="GET", times=2),
        ProxyRule("cut_body", method="GET", times=1),
        ProxyRule("503", method="HEAD", times=1),
        ProxyRule("reset", method="GET", target=r"list-type=2", times=1),
    ]
    data = payload(200_000, seed=1)
    await rig.storage.put("obj", data)
    assert rig.proxy.count("PUT") == 5
    assert await rig.storage.get("obj") == data
    assert (await rig.storage.head("obj")).size_bytes == len(data)
    assert await keys_of(rig.storage) == ["obj"]
    assert rig.proxy.faults == {"503": 2, "slowdown": 1, "500": 1, "429": 1, "reset": 3, "cut_body": 1}, (
        rig.proxy.requests
    )
    # aiohttp silently reconnects once when a pooled keep-alive connection turns out reset, so a
    # reset may cost no retry of ours; every other fault costs exactly one.
    assert 6 <= rig.storage.stats.counts["retry"] <= 9


async def test_deadline_is_respected_when_the_server_keeps_failing(rig: Rig) -> None:
    rig.storage.config = replace(rig.storage.config, retry=replace(FAST_RETRY, deadline_s=1.0))
    rig.proxy.rules = [ProxyRule("slowdown", method="PUT", times=None)]
    started = time.monotonic()
    with pytest.raises(UnavailableError, match="gave up after") as info:
        await rig.storage.put("never", b"x")
    elapsed_s = time.monotonic() - started
    assert info.value.retriable
    # Ignoring the deadline would retry for the policy's 10 s; the slack is for a loaded machine.
    assert 0.5 < elapsed_s < 3.5, elapsed_s
    assert rig.proxy.count("PUT") >= 3
    with pytest.raises(NotFoundError):
        await rig.direct.head("never")


async def test_slow_attempts_time_out_and_the_deadline_holds(rig: Rig) -> None:
    rig.storage.config = replace(
        rig.storage.config, retry=replace(FAST_RETRY, deadline_s=1.5, attempt_timeout_s=0.4)
    )
    rig.proxy.rules = [ProxyRule("delay", method="GET", times=None, delay_s=3.0)]
    await rig.direct.put("slow", b"data")
    started = time.monotonic()
    with pytest.raises(UnavailableError):
        await rig.storage.get("slow")
    # An attempt that outlived its 0.4 s timeout would get the reply after 3 s, and succeed.
    assert time.monotonic() - started < 2.9
    rig.proxy.rules = [ProxyRule("delay", method="GET", times=1, delay_s=3.0)]
    assert await rig.storage.get("slow") == b"data"  # the second attempt is fast


@pytest.mark.parametrize(
    ("rule", "error"), [(ProxyRule("403", method="PUT", times=None), InvalidArgumentError)]
)
async def test_forbidden_is_permanent_and_not_retried(
    rig: Rig, rule: ProxyRule, error: type[Exception]
) -> None:
    rig.proxy.rules = [rule]
    with pytest.raises(error):
        await rig.storage.put("x", b"1")
    assert rig.proxy.count("PUT") == 1
    assert rig.storage.stats.counts["retry"] == 0


async def test_not_found_and_precondition_failed_are_not_retried(rig: Rig) -> None:
    with pytest.raises(NotFoundError):
        await rig.storage.get("missing")
    assert rig.proxy.count("GET") == 1
    await rig.storage.put("once", b"1", if_absent=True)
    with pytest.raises(ConflictError):
        await rig.storage.put("once", b"2", if_absent=True)
    assert rig.proxy.count("PUT") == 2
    assert rig.storage.stats.counts["retry"] == 0


async def test_lost_reply_of_a_conditional_put_is_our_own_win(rig: Rig) -> None:
    rig.proxy.rules = [ProxyRule("lost_reply", method="PUT", header="if-none-match", times=1)]
    await rig.storage.put("lease", b"mine", if_absent=True)  # the retry meets 412 and finds its own bytes
    assert await rig.direct.get("lease") == b"mine"
    rig.proxy.rules = [ProxyRule("lost_reply", method="PUT", header="if-none-match", times=1)]
    await rig.direct.delete(["lease"])
    await rig.direct.put("lease", b"theirs")
    with pytest.raises(ConflictError):
        await rig.storage.put("lease", b"mine", if_absent=True)


async def test_multipart_failing_midway_is_aborted_and_leaves_nothing(rig: Rig) -> None:
    rig.storage.config = replace(rig.storage.config, retry=replace(FAST_RETRY, deadline_s=1.0))
    rig.proxy.rules = [ProxyRule("503", method="PUT", target=r"partNumber=2(&|$)", times=None)]
    upload = rig.storage.upload("mp")

    async def write_then_complete() -> None:
        for _ in range(4):
            await upload.write(payload(MIN_PART_SIZE_BYTES, seed=2))
        await upload.complete()

    with pytest.raises(UnavailableError):
        await write_then_complete()
    assert rig.proxy.count("DELETE", r"uploadId=") == 1  # AbortMultipartUpload
    assert await keys_of(rig.direct) == []
    client = await rig.direct.client()
    pending = await client.list_multipart_uploads(
        Bucket=rig.direct.config.bucket, Prefix=rig.direct.config.prefix
    )
    assert pending.get("Uploads", []) == []


async def test_lost_reply_of_complete_multipart_still_succeeds(rig: Rig) -> None:
    rig.proxy.rules = [ProxyRule("lost_reply", method="POST", target=r"uploadId=", times=1)]
    data = payload(2 * MIN_PART_SIZE_BYTES + 100, seed=3)
    await rig.storage.put("mp", data)
    assert await rig.direct.get("mp") == data


async def test_part_uploads_survive_resets(rig: Rig) -> None:
    rig.proxy.rules = [
        ProxyRule("reset", method="PUT", target=r"partNumber=1(&|$)", times=2),
        ProxyRule("slowdown", method="PUT", target=r"partNumber=2(&|$)", times=1),
        ProxyRule("500", method="POST", target=r"\?uploads$", times=1),
    ]
    data = payload(3 * MIN_PART_SIZE_BYTES, seed=4)
    await rig.storage.put("mp", data)
    assert await rig.direct.get("mp") == data
    assert rig.proxy.faults == {"reset": 2, "slowdown": 1, "500": 1}
    assert 2 <= rig.storage.stats.counts["retry"] <= 4  # aiohttp may absorb a reset (see above)


async def test_per_key_delete_errors_are_retried(rig: Rig) -> None:
    keys = [f"d/{i}" for i in range(30)]
    for key in keys:
        await rig.direct.put(key, b"x")
    rig.proxy.rules = [ProxyRule("delete_keys_fail", method="POST", target=r"\?delete", times=2)]
    await rig.storage.delete(keys)
    assert rig.proxy.count("POST", r"\?delete") == 3
    assert await keys_of(rig.direct) == []
