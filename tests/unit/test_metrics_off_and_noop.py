"""Metrics off (the default) wire nothing: the engine's append and fetch are its own methods, no hook
is set, no port is bound; ``client.metrics`` is the no-op twin, which takes every call a caller above
the engine makes. On, a local-storage client serves its own registry (the exporter's socket is real)."""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from s3stream import RecordBatch
from s3stream.assembly import open_client
from s3stream.config import Config
from s3stream.errors import InvalidArgumentError
from s3stream.metrics import NOOP_METRICS, NodeMetrics, NoopMetrics, start_metrics
from s3stream.metrics.instruments import Histogram

MiB = 1024 * 1024
CONFIG = Config(
    wal_capacity_bytes=16 * MiB,
    wal_record_max_bytes=2 * MiB,
    record_max_bytes=1 * MiB,
    wal_cache_size_bytes=8 * MiB,
    wal_upload_threshold_bytes=1 * MiB,
)


def scrape(url: str) -> dict[str, float]:
    body = urllib.request.urlopen(url, timeout=10).read().decode()
    return {
        f"{s.name}{sorted(s.labels.items())}": s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }


async def test_metrics_off_wire_nothing_into_the_engine(tmp_path: Path) -> None:
    client = await open_client(tmp_path, config=CONFIG)
    try:
        engine = client.engine
        assert client.metrics is NOOP_METRICS
        assert client.metrics_endpoint is None
        assert engine.append_one == engine._appends.append_one  # the AppendPath's own bound method
        assert engine.append == engine._appends.append
        assert "fetch" not in vars(engine)  # the class's method, not a wrapper
        assert engine._pipeline.meter is None
        assert engine._appends.latency is None  # no append is timed
        compactor = client.components["compactor"]
        assert compactor.meter is None  # type: ignore[attr-defined]
        stream = await client.streams.create_and_open_stream(epoch=0)
        assert await stream.append(RecordBatch(b"x" * 100)) == 0
    finally:
        await client.close()


async def test_the_noop_twin_takes_every_call_and_serves_nothing() -> None:
    twin = start_metrics(Config())
    assert twin is NOOP_METRICS
    assert isinstance(twin, NoopMetrics)
    assert not twin.enabled
    assert twin.endpoint is None
    twin.attach_engine(object())
    twin.attach_storage(object())
    twin.attach_compaction(None, [])
    twin.attach_heartbeat(object())
    twin.spark_batch(path="direct", outcome="committed", rows=10, commit_s=0.1)
    await twin.close()
    # every hook of the real metrics exists on the twin (callers above the engine use either)
    public = {n for n in dir(NodeMetrics) if n.startswith(("attach_", "spark_")) or n == "close"}
    assert public <= set(dir(NoopMetrics))


async def test_metrics_on_serve_this_clients_registry_and_stop_with_it(tmp_path: Path) -> None:
    config = CONFIG.replace(metrics_exporter_uri="prometheus://?host=127.0.0.1&port=0")
    client = await open_client(tmp_path, config=config)
    try:
        endpoint = client.metrics_endpoint
        assert endpoint is not None
        assert endpoint.startswith("http://127.0.0.1:")
        assert endpoint.endswith("/metrics")
        assert ":0/" not in endpoint  # the bound port, not the asked-for 0
        stream = await client.streams.create_and_open_stream(epoch=0)
        for size in (10, 200, 3000):
            await stream.append(RecordBatch(b"y" * size))
        await stream.fetch(0, 3, 1 * MiB)
        samples = scrape(endpoint)
        assert samples["s3stream_append_bytes_total[('node', '0')]"] == 3210
        assert samples["s3stream_append_requests_total[('node', '0'), ('outcome', 'ok')]"] == 3
        assert 1 <= samples["s3stream_append_latency_seconds_count[('node', '0')]"] <= 3  # sampled
        assert samples["s3stream_fetch_requests_total[('node', '0'), ('source', 'log_cache')]"] == 1
        assert samples["s3stream_fetch_bytes_total[('node', '0'), ('source', 'log_cache')]"] == 3210
        assert samples["s3stream_streams_open[('node', '0')]"] == 1
        assert samples["s3stream_wal_writes_total[('node', '0')]"] >= 1
        assert samples["process_cpu_seconds_total[]"] > 0  # the process collectors are registered
    finally:
        await client.close()
    port = int(endpoint.rsplit(":", 1)[1].split("/")[0])
    with socket.socket() as probe:  # closed with the client: nothing listens any more
        assert probe.connect_ex(("127.0.0.1", port)) != 0


async def test_a_port_in_use_fails_the_open_naming_the_key_and_leaves_nothing(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = CONFIG.replace(metrics_exporter_uri=f"prometheus://?host=127.0.0.1&port={port}")
        data_dir = tmp_path / "d"
        with pytest.raises(InvalidArgumentError, match=r"s3\.telemetry\.metrics\.exporter\.uri"):
            await open_client(data_dir, config=config)
        assert not data_dir.exists()  # a failed first open removes what it created


def test_histogram_buckets_count_values_at_their_upper_bound() -> None:
    hist = Histogram((0.1, 1.0))
    for value in (0.05, 0.1, 0.5, 1.0, 7.0):
        hist.observe(value)
    buckets, total = hist.snapshot()
    assert buckets == [("0.1", 2.0), ("1.0", 4.0), ("+Inf", 5.0)]  # le: value <= bound
    assert total == pytest.approx(8.65)
    assert hist.count == 5
