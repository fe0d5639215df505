"""FaultyObjectStorage over the memory and local backends: injected failures never leave partial
objects visible, slow and timed-out calls behave as declared, and plans replay from their seed."""

from __future__ import annotations

import random
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from s3stream.errors import ConflictError, NotFoundError, UnavailableError
from s3stream.storage.base import ObjectStorage
from s3stream.storage.local import LocalObjectStorage
from s3stream.storage.memory import MemoryObjectStorage
from s3stream.storage.retry import RetryPolicy, call_with_retries
from tests.support.faults import Fault, FaultPlan, FaultyObjectStorage
from tests.support.storage_contract import keys_of, payload


@pytest.fixture(params=["memory", "local"])
async def inner(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ObjectStorage]:
    store: ObjectStorage = (
        MemoryObjectStorage() if request.param == "memory" else LocalObjectStorage(tmp_path)
    )
    yield store
    await store.close()


async def test_failed_upload_write_aborts_and_leaves_nothing(inner: ObjectStorage) -> None:
    faulty = FaultyObjectStorage(inner, FaultPlan([Fault("upload.write", skip_calls=2, times=1)]))
    upload = faulty.upload("obj")
    await upload.write(payload(9 * 1024 * 1024, seed=1))
    await upload.write(b"more")
    with pytest.raises(UnavailableError, match="injected"):
        await upload.write(b"boom")
    with pytest.raises(NotFoundError):
        await inner.head("obj")
    assert await keys_of(inner) == []
    assert faulty.injected == {"upload.write:error": 1}


async def test_failed_complete_publishes_nothing(inner: ObjectStorage) -> None:
    faulty = FaultyObjectStorage(inner, FaultPlan([Fault("upload.complete")]))
    upload = faulty.upload("obj")
    await upload.write(b"data")
    with pytest.raises(UnavailableError):
        await upload.complete()
    assert await keys_of(inner) == []


async def test_lost_reply_takes_effect_but_reports_failure(inner: ObjectStorage) -> None:
    faulty = FaultyObjectStorage(inner, FaultPlan([Fault("put", kind="lost_reply", times=1)]))
    with pytest.raises(UnavailableError, match="reply lost"):
        await faulty.put("k", b"v", if_absent=True)
    assert await inner.get("k") == b"v"
    with pytest.raises(ConflictError):  # a naive retry of a conditional create now conflicts
        await faulty.put("k", b"v", if_absent=True)


async def test_timeouts_wait_then_fail_and_slow_calls_wait_then_succeed(inner: ObjectStorage) -> None:
    plan = FaultPlan(
        [Fault("get", kind="timeout", delay_s=0.05, times=1), Fault("get", kind="slow", delay_s=0.05)]
    )
    faulty = FaultyObjectStorage(inner, plan)
    await faulty.put("k", b"v")
    started = time.monotonic()
    with pytest.raises(UnavailableError, match="timed out"):
        await faulty.get("k")
    assert await faulty.get("k") == b"v"
    assert time.monotonic() - started >= 0.1
    assert faulty.injected == {"get:timeout": 1, "get:slow": 1}


async def test_key_prefix_narrows_a_fault(inner: ObjectStorage) -> None:
    faulty = FaultyObjectStorage(inner, FaultPlan([Fault("put", key_prefix="wal/")]))
    await faulty.put("data/1", b"x")
    with pytest.raises(UnavailableError):
        await faulty.put("wal/1", b"x")
    assert await keys_of(inner) == ["data/1"]


async def test_plans_replay_from_their_seed() -> None:
    async def pattern(seed: int) -> list[bool]:
        faulty = FaultyObjectStorage(
            MemoryObjectStorage(), FaultPlan([Fault("*", probability=0.3)], seed=seed)
        )
        outcome = []
        for i in range(40):
            try:
                await faulty.put(f"k{i}", b"x")
                outcome.append(True)
            except UnavailableError:
                outcome.append(False)
        return outcome

    first = await pattern(42)
    assert first == await pattern(42)
    assert first != await pattern(43)
    assert 0 < first.count(False) < 40


async def test_a_retrying_caller_gets_through_random_failures(inner: ObjectStorage) -> None:
    faulty = FaultyObjectStorage(inner, FaultPlan([Fault("*", probability=0.5)], seed=7))
    policy = RetryPolicy(deadline_s=5, backoff_base_s=0.001, backoff_max_s=0.002, attempts_max=100)
    rng = random.Random(7)
    for i in range(20):
        await call_with_retries(
            "put",
            lambda i=i: faulty.put(f"k/{i:02d}", bytes([i])),  # type: ignore[misc]
            policy=policy,
            classify=lambda exc: exc,  # type: ignore[arg-type,return-value]
            rng=rng,
        )
    assert await keys_of(inner) == [f"k/{i:02d}" for i in range(20)]
    assert sum(faulty.injected.values()) > 5


async def test_disabled_plan_injects_nothing(inner: ObjectStorage) -> None:
    plan = FaultPlan([Fault("*")], enabled=False)
    faulty = FaultyObjectStorage(inner, plan)
    await faulty.put("k", b"v")
    assert [i.key async for i in faulty.list()] == ["k"]
    plan.enabled = True
    with pytest.raises(UnavailableError):
        await faulty.delete(["k"])
