"""Metrics on a real client on S3 (Ceph RGW through the s3_server fixture), scraped over HTTP.

The counters agree with the workload the test drives (bytes appended = the sum written; objects
uploaded = objects committed in metadata; S3 requests by operation; fetches by source; compaction and
GC counters); the endpoint keeps serving through garbage bytes, wrong paths and slow clients; two
clients in one process each serve their own registry."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
import socket
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.harness import ensure_bucket
from compaction.compactor import Compactor
from compaction.maintenance import MaintenanceElection
from s3stream import RecordBatch
from s3stream.assembly import open_client
from s3stream.config import Config
from s3stream.engine.client import Client
from s3stream.metadata.base import ObjectState
from tests.support.s3 import S3TestServer, delete_prefix

pytestmark = pytest.mark.integration
KiB = 1024
MiB = 1024 * KiB

CONFIG = Config(
    wal_capacity_bytes=64 * MiB,
    wal_record_max_bytes=2 * MiB,
    record_max_bytes=1 * MiB,
    wal_cache_size_bytes=32 * MiB,
    wal_upload_threshold_bytes=16 * MiB,
    wal_upload_interval_ms=3_600_000,
    object_delete_retention_minutes=0,
    upload_retry_backoff_ms=20,
    metrics_exporter_uri="prometheus://?host=127.0.0.1&port=0",
)

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str) -> Samples:
    body = urllib.request.urlopen(url, timeout=10).read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sample ``name`` with exactly ``labels`` plus node; 0 when the series does not exist yet."""
    want = frozenset({("node", labels.pop("node", "0")), *labels.items()})
    return samples.get((name, want), 0.0)


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of every ``name`` sample whose labels include ``labels``."""
    return sum(v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= ls)


async def ascrape(url: str) -> Samples:
    return await asyncio.to_thread(scrape, url)


@pytest.fixture
async def client(tmp_path: Path, s3_server: S3TestServer, s3_prefix: str) -> AsyncIterator[Client]:
    client = await open_client(tmp_path, bucket_uri=s3_server.uri(s3_prefix), config=CONFIG)
    try:
        yield client
    finally:
        await client.close()


async def test_counters_agree_with_a_workload_of_appends_uploads_fetches_and_compaction(
    client: Client, rng_seed: int
) -> None:
    rng = random.Random(rng_seed)
    endpoint = client.metrics_endpoint
    assert endpoint is not None
    streams = [await client.streams.create_and_open_stream(epoch=0) for _ in range(4)]
    written = appends = 0
    for _ in range(3):  # three uploads: three StreamSet objects (every stream below the split size)
        for _ in range(40):
            stream = rng.choice(streams)
            size = rng.randint(1, 8 * KiB)
            await stream.append(RecordBatch(rng.randbytes(size)))
            written += size
            appends += 1
        await client.engine.force_upload(None)
    during = await ascrape(endpoint)
    assert value(during, "s3stream_append_bytes_total") == written
    assert value(during, "s3stream_append_requests_total", outcome="ok") == appends
    assert value(during, "s3stream_append_requests_total", outcome="error") == 0
    sampled = value(during, "s3stream_append_latency_seconds_count")  # one append in 16 is timed
    assert appends // 16 - 1 <= sampled <= appends // 16 + 1
    assert value(during, "s3stream_append_latency_seconds_bucket", le="+Inf") == sampled
    assert 0 < value(during, "s3stream_append_latency_seconds_sum") < 30 * sampled
    committed = await client.engine.metadata.list_objects([ObjectState.COMMITTED])
    uploaded = total(during, "s3stream_uploads_total", outcome="ok")
    assert uploaded == len(committed) == 3
    assert value(during, "s3stream_commits_total", outcome="ok") == 3
    assert value(during, "s3stream_commit_latency_seconds_count") == 3
    assert total(during, "s3stream_upload_bytes_total") == sum(o.size_bytes for o in committed)
    assert value(during, "s3stream_upload_backlog_bytes") == 0  # everything is committed
    assert value(during, "s3stream_upload_oldest_record_age_seconds") == 0
    assert total(during, "s3stream_s3_requests_total", operation="put", status="ok") >= 3
    assert value(during, "s3stream_s3_bytes_total", bucket="0", operation="put", direction="out") >= sum(
        o.size_bytes for o in committed
    )
    assert value(during, "s3stream_node_epoch") >= 1
    assert 0 < value(during, "s3stream_node_lease_remaining_seconds") <= CONFIG.node_lease_ms / 1000
    assert value(during, "s3stream_streams_open") == 4
    assert value(during, "s3stream_wal_capacity_bytes") == CONFIG.wal_capacity_bytes

    # Fetches: from the LogCache; then, its uploaded blocks released, a sequential consumer: its first
    # read misses the block cache (S3), the later ones find their blocks loaded (block cache).
    stream = streams[0]
    expected = stream.confirm_offset
    cached = await stream.fetch(0, expected, 8 * MiB)
    client.engine.cache.try_real_free(target_bytes=0)
    consumed: list[bytes] = []
    offset = fetches = 0
    block_cache_bytes_max = 0.0
    while offset < expected:
        got = await stream.fetch(offset, expected, 1)  # at least one batch per call
        consumed += [b.payload for b in got]
        offset = got[-1].end_offset
        fetches += 1
        reading = await ascrape(endpoint)  # blocks are held while the consumer is in them
        block_cache_bytes_max = max(block_cache_bytes_max, value(reading, "s3stream_block_cache_bytes"))
    assert block_cache_bytes_max > 0
    assert consumed == [b.payload for b in cached]
    fetched = sum(map(len, consumed))
    after_fetch = await ascrape(endpoint)
    assert value(after_fetch, "s3stream_fetch_requests_total", source="log_cache") == 1
    assert value(after_fetch, "s3stream_fetch_bytes_total", source="log_cache") == fetched
    assert value(after_fetch, "s3stream_fetch_requests_total", source="s3") >= 1
    assert value(after_fetch, "s3stream_fetch_requests_total", source="block_cache") >= 1
    assert total(after_fetch, "s3stream_fetch_requests_total") == fetches + 1
    assert total(after_fetch, "s3stream_fetch_bytes_total") == 2 * fetched
    assert total(after_fetch, "s3stream_fetch_latency_seconds_count") == fetches + 1
    assert total(after_fetch, "s3stream_s3_requests_total", operation="get", status="ok") >= 1
    assert value(after_fetch, "s3stream_s3_bytes_total", bucket="0", operation="get", direction="in") > 0

    # Compaction: the three StreamSet objects become one; GC (retention 0) deletes the three.
    election = client.components["maintenance"]
    assert isinstance(election, MaintenanceElection)
    deadline = time.monotonic() + 30
    while not election.running:
        assert time.monotonic() < deadline, "this node never got the maintenance lease"
        await asyncio.sleep(0.05)
    compactor = client.components["compactor"]
    assert isinstance(compactor, Compactor)
    report = await compactor.run_once(stream_objects=True)
    assert report.problems == ()
    after = await ascrape(endpoint)
    assert value(after, "s3stream_compaction_runs_total", kind="stream_set", outcome="ok") == 1
    assert value(after, "s3stream_compaction_runs_total", kind="stream_object", outcome="ok") == 1
    assert value(after, "s3stream_compaction_objects_in_total", kind="stream_set") == 3
    assert value(after, "s3stream_compaction_objects_out_total", kind="stream_set") == (
        report.stream_set_objects_written + report.stream_objects_written
    )
    assert value(after, "s3stream_compaction_bytes_in_total", kind="stream_set") == report.bytes_read > 0
    assert value(after, "s3stream_compaction_bytes_out_total", kind="stream_set") == report.bytes_written > 0
    # The prepared-object reaper (every second) may delete the same objects in the same instant: each
    # collector counts the deletes it sent.
    assert report.gc.deleted_count <= 3
    assert value(after, "s3stream_gc_deleted_objects_total") in (3, 3 + report.gc.deleted_count)
    assert value(after, "s3stream_gc_deleted_bytes_total") >= report.gc.deleted_bytes
    assert value(after, "s3stream_gc_deleted_bytes_total") > 0
    assert total(after, "s3stream_s3_requests_total", operation="delete", status="ok") >= 1
    # every operation seen has a latency histogram whose count is its requests
    for operation in ("put", "get", "delete", "list"):
        requests = total(after, "s3stream_s3_requests_total", operation=operation)
        assert requests > 0, operation
        assert (
            value(after, "s3stream_s3_request_latency_seconds_count", bucket="0", operation=operation)
            == requests
        )
    # counters never go down between scrapes
    for key, earlier in during.items():
        if key[0].endswith(("_total", "_count")):
            assert after.get(key, 0) >= earlier, key


async def test_the_endpoint_survives_bad_requests_and_keeps_serving(client: Client) -> None:
    endpoint = client.metrics_endpoint
    assert endpoint is not None
    host, port = "127.0.0.1", int(endpoint.rsplit(":", 1)[1].split("/")[0])

    def raw(data: bytes) -> bytes:
        """Send ``data``, return what the server answers before it closes the connection."""
        with socket.create_connection((host, port), timeout=10) as conn:
            with contextlib.suppress(OSError):  # the server may close before reading it all
                conn.sendall(data)
            answer = b""
            with contextlib.suppress(OSError):
                while chunk := conn.recv(65536):
                    answer += chunk
            return answer

    def check() -> None:
        started = time.monotonic()
        samples = scrape(endpoint)
        assert value(samples, "s3stream_streams_open") == 0
        assert time.monotonic() - started < 5  # not held up by the slow clients

    def abuse() -> None:
        # garbage (an HTTP/0.9-looking line): a 400 error page, then the connection closes
        assert b"Error code: 400" in raw(b"\x00\xff\x13garbage\r\n\r\n")
        check()
        assert raw(b"NOT-A-METHOD / HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.0 405 ")
        assert b"Error code: 400" in raw(random.Random(7).randbytes(100_000))  # binary noise
        check()
        with pytest.raises(urllib.error.HTTPError) as not_found:
            urllib.request.urlopen(endpoint.replace("/metrics", "/nope"), timeout=10)
        assert not_found.value.code == 404
        assert raw(b"GET /metrics?x=%zz HTTP/1.0\r\n\r\n").startswith(b"HTTP/1.0 200 OK")
        long_header = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * 70_000 + b"\r\n\r\n"
        assert raw(long_header).startswith(b"HTTP/1.0 431 ")
        check()
        # slow clients: silent connections and a request sent a byte at a time hold threads, not the server
        silent = [socket.create_connection((host, port), timeout=10) for _ in range(20)]
        trickle = socket.create_connection((host, port), timeout=10)
        try:
            trickle.sendall(b"GE")
            check()
            check()
        finally:
            trickle.close()
            for conn in silent:
                conn.close()
        check()

    await asyncio.to_thread(abuse)
    stream = await client.streams.create_and_open_stream(epoch=0)
    await stream.append(RecordBatch(b"z" * 5))
    samples = await ascrape(endpoint)
    assert value(samples, "s3stream_append_bytes_total") == 5


async def test_two_clients_in_one_process_serve_their_own_series(
    tmp_path: Path, s3_server: S3TestServer, s3_prefix: str
) -> None:
    first = await open_client(tmp_path / "a", bucket_uri=s3_server.uri(s3_prefix + "a/"), config=CONFIG)
    try:
        second = await open_client(
            tmp_path / "b", bucket_uri=s3_server.uri(s3_prefix + "b/"), config=CONFIG.replace(node_id=7)
        )
        try:
            assert first.metrics_endpoint is not None
            assert second.metrics_endpoint is not None
            assert first.metrics_endpoint != second.metrics_endpoint
            s1 = await first.streams.create_and_open_stream(epoch=0)
            s2 = await second.streams.create_and_open_stream(epoch=0)
            await s1.append(RecordBatch(b"a" * 100))
            for _ in range(3):
                await s2.append(RecordBatch(b"b" * 1000))
            one = await ascrape(first.metrics_endpoint)
            two = await ascrape(second.metrics_endpoint)
            assert value(one, "s3stream_append_bytes_total") == 100
            assert value(two, "s3stream_append_bytes_total", node="7") == 3000
            assert {dict(labels).get("node") for name, labels in one if name.startswith("s3stream_")} == {"0"}
            assert {dict(labels).get("node") for name, labels in two if name.startswith("s3stream_")} == {"7"}
        finally:
            await second.close()
        # the first keeps serving after the second closed
        assert value(await ascrape(first.metrics_endpoint), "s3stream_append_bytes_total") == 100
    finally:
        await first.close()


async def test_s3_series_are_per_bucket_over_two_buckets(
    tmp_path: Path, s3_server: S3TestServer, s3_prefix: str
) -> None:
    """Replication writes every object to both buckets: each bucket's PUTs and bytes are its own
    series, and both buckets are reported healthy."""
    other = dataclasses.replace(s3_server, bucket=f"{s3_server.bucket}-b")
    await ensure_bucket(other.bench_target())
    buckets = f"{s3_server.uri(s3_prefix)},{other.uri(s3_prefix).replace('0@', '1@', 1)}"
    config = CONFIG.replace(data_buckets_strategy="replication")
    client = await open_client(tmp_path, bucket_uri=buckets, config=config)
    try:
        assert client.metrics_endpoint is not None
        stream = await client.streams.create_and_open_stream(epoch=0)
        await stream.append(RecordBatch(b"r" * 10_000))
        await client.engine.force_upload(None)
        committed = await client.engine.metadata.list_objects([ObjectState.COMMITTED])
        assert len(committed) == 1
        samples = await ascrape(client.metrics_endpoint)
        for bucket in ("0", "1"):
            assert (
                total(samples, "s3stream_s3_requests_total", bucket=bucket, operation="put", status="ok") >= 1
            )
            assert value(
                samples, "s3stream_s3_bytes_total", bucket=bucket, operation="put", direction="out"
            ) >= (committed[0].size_bytes)
            assert value(samples, "s3stream_bucket_healthy", bucket=bucket) == 1
    finally:
        await client.close()
        delete_prefix(other, s3_prefix)
