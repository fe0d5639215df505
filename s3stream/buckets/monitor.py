"""The buckets' background duties on a node: live sharding weights in, health figures out.

:class:`BucketsMonitor` (``start()`` / ``close()``) polls the KV key :data:`WEIGHTS_KEY` every
``s3.data.buckets.weights.poll.ms`` and applies a changed value to the sharding strategy without a
restart (once present, the KV value wins over ``s3.data.buckets.weights``; a value that does not
parse or names other bucket ids is logged and ignored, keeping the weights in force). Every
``PUBLISH_INTERVAL_S`` it writes this node's bucket figures to ``HEALTH_KEY_PREFIX + <node id>``
(JSON, no credential: error texts are redacted), so ``s3stream buckets`` can show them without
contacting nodes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import Any

from s3stream.buckets.spec import parse_weights
from s3stream.buckets.storage import MultiBucketStorage
from s3stream.buckets.strategy import Sharding
from s3stream.errors import S3StreamError
from s3stream.logfmt import log_event
from s3stream.metadata.base import MetadataStore

log = logging.getLogger(__name__)

WEIGHTS_KEY = "__s3stream/buckets.weights"
"""KV key of the live sharding weights (``0:1,1:1``, UTF-8)."""
HEALTH_KEY_PREFIX = "__s3stream/buckets.health/"
"""KV key prefix of each node's published bucket figures (``<prefix><node id>``)."""
PUBLISH_INTERVAL_S = 5.0


def health_record(storage: MultiBucketStorage, *, now_ms: int) -> bytes:
    """The JSON this node publishes: ``{"at_ms", "buckets": {"<id>": {healthy, errors_recent,
    last_error, uploads_recent, write_share}}}``."""
    buckets: dict[str, Any] = {
        str(s.bucket_id): {
            "healthy": s.healthy,
            "errors_recent": s.errors_recent,
            "last_error": s.last_error,
            "uploads_recent": s.uploads_recent,
            "write_share": round(s.write_share, 4),
        }
        for s in storage.stats().values()
    }
    return json.dumps({"at_ms": now_ms, "buckets": buckets}, sort_keys=True).encode()


class BucketsMonitor:
    def __init__(
        self,
        storage: MultiBucketStorage,
        metadata: MetadataStore,
        *,
        node_id: int | None,
        poll_ms: int,
        publish_interval_s: float = PUBLISH_INTERVAL_S,
    ) -> None:
        self.storage = storage
        self.metadata = metadata
        self.node_id = node_id
        self.poll_s = poll_ms / 1000
        self.publish_interval_s = publish_interval_s
        self._task: asyncio.Task[None] | None = None
        self._applied: bytes | None = None

    async def poll_weights(self) -> bool:
        """Read the KV weights once; True when a new value was applied."""
        strategy = self.storage.strategy
        if not isinstance(strategy, Sharding):
            return False
        value = await self.metadata.kv_get(WEIGHTS_KEY)
        if value is None or value == self._applied:
            return False
        self._applied = value
        try:
            weights = parse_weights(value.decode("utf-8", "replace"), self.storage.bucket_ids)
        except S3StreamError as exc:
            log_event(log, logging.WARNING, "buckets.weights_ignored", key=WEIGHTS_KEY, error=exc)
            return False
        strategy.set_weights(weights)
        log_event(log, logging.INFO, "buckets.weights_applied", weights=weights)
        return True

    async def publish(self) -> None:
        if self.node_id is None:
            return
        record = health_record(self.storage, now_ms=int(time.time() * 1000))
        await self.metadata.kv_put(f"{HEALTH_KEY_PREFIX}{self.node_id}", record)

    async def start(self) -> None:
        """Apply the KV weights once now (before the first upload), then keep polling."""
        await self.poll_weights()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="buckets-monitor")

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_publish = loop.time()
        while True:
            try:
                await self.poll_weights()
                if loop.time() >= next_publish:
                    next_publish = loop.time() + self.publish_interval_s
                    await self.publish()
            except asyncio.CancelledError:
                raise
            except S3StreamError as exc:  # metadata unavailable or this node fenced: next round
                log_event(log, logging.WARNING, "buckets.monitor_failed", error=exc, action="retry")
            except Exception as exc:  # noqa: BLE001 - a bug must not end the task silently: log it, next round
                log_event(log, logging.ERROR, "buckets.monitor_failed", error=f"{type(exc).__name__}: {exc}", action="retry")  # fmt: skip
            await asyncio.sleep(self.poll_s)

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
