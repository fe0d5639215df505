"""A bucket made unreachable during ingest, through its fault proxy (requests accepted, never
answered): with failover and with replication no error reaches the appends and no record is lost; a
failover data dir goes back to its primary once probes succeed; replication commits only objects that
every bucket holds.

The outage lasts ``S3STREAM_BUCKET_OUTAGE_S`` seconds (default 30).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from benchmarks.fault_proxy import FaultProxy
from s3stream.assembly import open_client
from s3stream.buckets.storage import MultiBucketStorage
from s3stream.config import Config
from s3stream.engine.client import Client, Stream
from s3stream.metadata.base import ObjectState
from s3stream.model import RecordBatch
from tests.support.buckets_e2e import CONFIG, object_keys, payload, read_all
from tests.support.fault_proxy import proxied
from tests.support.s3 import S3TestServer

pytestmark = pytest.mark.integration

OUTAGE_S = float(os.environ.get("S3STREAM_BUCKET_OUTAGE_S", "30"))
APPEND_INTERVAL_S = 0.01
RECORD_BYTES = 2048
BACK_ON_PRIMARY_S_MAX = 15.0


def outage_config(strategy: str) -> Config:
    return CONFIG.replace(
        data_buckets_strategy=strategy,
        data_buckets_request_timeout_ms=500,
        data_buckets_probe_interval_ms=200,
        wal_upload_threshold_bytes=64 * 1024,
        wal_upload_interval_ms=200,
    )


class Appender:
    """Appends to ``streams`` round robin until stopped; remembers every acknowledged record and the
    longest time one append took."""

    def __init__(self, streams: list[Stream]) -> None:
        self.streams = streams
        self.acked: dict[int, list[tuple[int, bytes]]] = {s.stream_id: [] for s in streams}
        self.slowest_s = 0.0
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            stream = self.streams[n % len(self.streams)]
            base = stream.next_offset
            data = payload(stream.stream_id, base, RECORD_BYTES)
            started = time.monotonic()
            offset = await stream.append(RecordBatch(data))
            self.slowest_s = max(self.slowest_s, time.monotonic() - started)
            self.acked[stream.stream_id].append((offset, data))
            n += 1
            await asyncio.sleep(APPEND_INTERVAL_S)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        self._stop.set()
        assert self._task is not None
        await self._task  # an append that failed raises here


async def placements_after(client: Client, since_ms: int) -> list[tuple[int, ...]]:
    metadata = client.engine.metadata
    objects = [
        o for o in await metadata.list_objects([ObjectState.COMMITTED]) if o.committed_at_ms >= since_ms
    ]
    placed = await metadata.placements([o.object_id for o in objects])
    return [placed.get(o.object_id, (0,)) for o in sorted(objects, key=lambda o: o.committed_at_ms)]


@pytest.mark.parametrize("strategy", ["failover", "replication"])
async def test_a_bucket_unreachable_during_ingest_loses_nothing(
    tmp_path: Path,
    strategy: str,
    s3_server: S3TestServer,
    s3_prefix: str,
    fault_proxies: Callable[[], FaultProxy],
) -> None:
    proxies = [fault_proxies(), fault_proxies()]
    servers = [proxied(s3_server, p) for p in proxies]
    buckets = ",".join(
        servers[i].uri(f"{s3_prefix}{name}/").replace("0@", f"{i}@", 1) for i, name in enumerate("ab")
    )
    config = outage_config(strategy)
    client = await open_client(tmp_path, bucket_uri=buckets, config=config)
    try:
        storage = client.engine.storage
        assert isinstance(storage, MultiBucketStorage)
        streams = [await client.streams.create_and_open_stream() for _ in range(2)]
        appender = Appender(streams)
        appender.start()
        await asyncio.sleep(1.0)
        assert (await placements_after(client, 0))[:1] == [(0,) if strategy == "failover" else (0, 1)]

        await asyncio.to_thread(proxies[0].blackhole)
        outage_end_s = time.monotonic() + OUTAGE_S
        seen_unhealthy = False
        while time.monotonic() < outage_end_s:
            seen_unhealthy = seen_unhealthy or not storage.stats()[0].healthy
            await asyncio.sleep(0.1)
        assert seen_unhealthy
        healed_ms = int(time.time() * 1000)
        await asyncio.to_thread(proxies[0].heal)

        if strategy == "failover":  # uploads go back to the primary once its probes succeed
            deadline_s = time.monotonic() + BACK_ON_PRIMARY_S_MAX
            while (0,) not in await placements_after(client, healed_ms):
                assert time.monotonic() < deadline_s, "uploads never went back to the primary"
                await asyncio.sleep(0.2)
        else:
            await asyncio.sleep(2.0)
        await appender.stop()  # no append failed
        await client.engine.force_upload(None)

        got = {s.stream_id: await read_all(s) for s in streams}
        assert got == appender.acked  # every acknowledged record, objects in both buckets read
        assert sum(len(v) for v in got.values()) > 100
        print(
            f"{strategy}: {sum(len(v) for v in got.values())} records, slowest append {appender.slowest_s:.3f} s"
        )

        placed = await placements_after(client, 0)
        if strategy == "failover":
            assert any(p == (1,) for p in placed)  # the standby took uploads during the outage
        else:
            assert set(placed) == {(0, 1)}  # committed only with both copies
            keys = []
            for i, name in enumerate("ab"):
                plain = servers[i].storage(f"{s3_prefix}{name}/")
                try:
                    keys.append(await object_keys(plain, config.namespace))
                finally:
                    await plain.close()
            committed = await client.engine.metadata.list_objects([ObjectState.COMMITTED])
            assert len(keys[0]) >= len(committed)
            assert keys[0] == keys[1]
    finally:
        await client.close()
