"""A metrics hook that raises never changes the I/O it observes: the S3 client's request meter and
the upload pipeline's step meter are called through s3stream.hooks.call_hook (logged once)."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest

from s3stream.engine.pipeline import UploadPipeline
from s3stream.errors import InvalidArgumentError
from s3stream.storage.retry import RetryPolicy
from s3stream.storage.s3client import S3Client, S3Config


class RaisingMeter:
    def __init__(self) -> None:
        self.calls = 0

    def attempted(self, op: str, error: BaseException | None, seconds: float) -> None:
        self.calls += 1
        raise RuntimeError("meter broke")

    def retried(self, op: str) -> None:
        raise RuntimeError("meter broke")

    def __call__(self, *args: object) -> None:
        self.calls += 1
        raise RuntimeError("meter broke")


def _failures(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("hook.failed")]


async def test_a_raising_request_meter_neither_fails_nor_retries_a_successful_attempt(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = S3Client(S3Config(bucket="b", retry=RetryPolicy(deadline_s=1.0)))
    meter = client.request_meter = RaisingMeter()

    async def no_client() -> object:
        return object()

    client.client = no_client  # type: ignore[method-assign]
    attempts = 0

    async def attempt(_client: Any) -> int:
        nonlocal attempts
        attempts += 1
        return 42

    caplog.set_level(logging.ERROR, logger="s3stream.hooks")
    assert await client.call("PUT", "'k'", attempt) == 42
    assert await client.call("PUT", "'k'", attempt) == 42
    assert attempts == 2  # no retry
    assert meter.calls == 2

    async def refused(_client: Any) -> int:
        raise InvalidArgumentError("refused")

    with pytest.raises(InvalidArgumentError, match="refused"):  # the call's error, not the meter's
        await client.call("PUT", "'k'", refused)
    assert len(_failures(caplog)) == 1  # logged once


async def test_a_raising_step_meter_does_not_fail_a_successful_upload_step() -> None:
    meter = RaisingMeter()
    pipeline: Any = SimpleNamespace(
        config=SimpleNamespace(upload_retry_backoff_ms=1, upload_retry_backoff_max_ms=2),
        meter=meter,
        supervisor=SimpleNamespace(check_alive=lambda: None),
        last_failure=None,
        stats=SimpleNamespace(upload_retries=0),
    )
    runs = 0

    async def commit() -> str:
        nonlocal runs
        runs += 1
        return "committed"

    assert await UploadPipeline._retry(pipeline, "commit", commit) == "committed"
    assert runs == 1  # not committed again
    assert meter.calls == 1


async def test_a_raising_gc_meter_does_not_fail_the_deletion_pass() -> None:
    from compaction.gc import GarbageCollector
    from s3stream.metadata.memory import MemoryMetadataStore
    from s3stream.objectformat import object_key
    from s3stream.storage.memory import MemoryObjectStorage

    store, storage = MemoryMetadataStore(), MemoryObjectStorage()
    doomed = await store.prepare_objects(count=1, ttl_ms=1)  # the first id of the range
    await storage.put(object_key(doomed, "ns"), b"bytes of an upload that never committed")
    collector = GarbageCollector(store, storage, namespace="ns", retention_ms=0, orphan_ttl_ms=0)
    meter = RaisingMeter()
    collector.meter = meter
    import asyncio

    await asyncio.sleep(0.01)
    assert doomed in await collector.reap()  # expired, deleted, metered: the meter's error is ignored
    assert meter.calls == 1
    assert [o async for o in storage.list("")] == []
