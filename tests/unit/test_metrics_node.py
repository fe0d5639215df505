"""A node's metrics without an engine: hooks in, families out (the same collector the endpoint serves)."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from s3stream.metrics.families import NodeCollector
from s3stream.metrics.node import NodeMetrics, error_status
from s3stream.storage.memory import MemoryObjectStorage


class _MeteredBackend:
    """Stands in for an S3 backend: a request meter hook and no byte counters."""

    def __init__(self) -> None:
        self.request_meter: object = None
        self.stats = "not StorageStats"  # ignored, never read at scrape time


class _SeveralBuckets:
    """A storage over several backends that maps their bucket ids to them, with a ``stats`` of
    another kind."""

    def __init__(self, *backends: object) -> None:
        self._backends = dict(enumerate(backends))

    def backends(self) -> dict[int, object]:
        return self._backends

    def stats(self) -> dict[int, object]:
        return {}


def _samples(metrics: NodeMetrics) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    registry = CollectorRegistry()
    registry.register(NodeCollector(metrics))
    body = generate_latest(registry).decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }


class _ClientError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"status {status}")
        self.response = {"ResponseMetadata": {"HTTPStatusCode": status}}


def test_s3_attempts_are_counted_by_bucket_operation_and_status_for_every_backend() -> None:
    metrics = NodeMetrics(node_id=3)
    metered, other = _MeteredBackend(), _MeteredBackend()
    memory = MemoryObjectStorage()
    metrics.attach_storage(_SeveralBuckets(metered, memory, other))
    assert metered.request_meter is metrics.s3["0"]
    assert other.request_meter is metrics.s3["2"]
    assert metrics.storage_stats == [("1", memory.stats)]  # the memory twin's counters; the fake's ignored
    asyncio.run(memory.put("k", b"x" * 10))
    bucket0, bucket2 = metrics.s3["0"], metrics.s3["2"]
    bucket0.attempted("PUT", None, 0.01)
    bucket0.attempted("PUT", _ClientError(503), 0.02)
    bucket0.retried("PUT")
    bucket0.attempted("UploadPartCopy", TimeoutError(), 0.5)
    bucket0.attempted("SomethingNew", None, 0.001)
    bucket2.attempted("PUT", None, 0.01)
    samples = _samples(metrics)
    node = ("node", "3")

    def get(name: str, **labels: str) -> float:
        return samples.get((name, frozenset({node, *labels.items()})), 0.0)

    b0 = {"bucket": "0"}
    assert get("s3stream_s3_requests_total", **b0, operation="put", status="ok") == 1
    assert get("s3stream_s3_requests_total", **b0, operation="put", status="503") == 1
    assert get("s3stream_s3_requests_total", **b0, operation="upload_part_copy", status="timeout") == 1
    assert get("s3stream_s3_requests_total", **b0, operation="other", status="ok") == 1
    assert get("s3stream_s3_requests_total", bucket="2", operation="put", status="ok") == 1
    assert get("s3stream_s3_retries_total", **b0, operation="put") == 1
    assert get("s3stream_s3_retries_total", bucket="2", operation="put") == 0
    assert get("s3stream_s3_request_latency_seconds_count", **b0, operation="put") == 2
    assert get("s3stream_s3_request_latency_seconds_count", bucket="2", operation="put") == 1
    assert get("s3stream_s3_bytes_total", bucket="1", operation="put", direction="out") == 10
    assert not any(name == "s3stream_bucket_healthy" for name, _ in samples)  # no health to read


def test_one_storage_is_bucket_0() -> None:
    metrics = NodeMetrics(node_id=1)
    backend = _MeteredBackend()
    metrics.attach_storage(backend)
    assert backend.request_meter is metrics.s3["0"]


def test_compaction_gc_and_spark_hooks_reach_their_series() -> None:
    metrics = NodeMetrics(node_id=0)
    metrics.compaction_pass("stream_set", (100, 90, 4, 1))
    metrics.compaction_pass("stream_set", None)
    metrics.compaction_pass("stream_object", (50, 50, 2, 1))
    metrics.gc_deleted(4, 100)
    metrics.spark_batch(path="direct", outcome="committed", rows=7, commit_s=0.2)
    metrics.spark_batch(path="direct", outcome="skipped", rows=7, commit_s=None)
    samples = _samples(metrics)
    node = ("node", "0")

    def get(name: str, **labels: str) -> float:
        return samples.get((name, frozenset({node, *labels.items()})), 0.0)

    assert get("s3stream_compaction_runs_total", kind="stream_set", outcome="ok") == 1
    assert get("s3stream_compaction_runs_total", kind="stream_set", outcome="error") == 1
    assert get("s3stream_compaction_bytes_in_total", kind="stream_set") == 100
    assert get("s3stream_compaction_bytes_out_total", kind="stream_object") == 50
    assert get("s3stream_compaction_objects_in_total", kind="stream_set") == 4
    assert get("s3stream_compaction_objects_out_total", kind="stream_object") == 1
    assert get("s3stream_gc_deleted_objects_total") == 4
    assert get("s3stream_gc_deleted_bytes_total") == 100
    assert get("s3stream_spark_batches_total", path="direct", outcome="committed") == 1
    assert get("s3stream_spark_batches_total", path="direct", outcome="skipped") == 1
    assert get("s3stream_spark_rows_total") == 7  # a skipped batch adds no rows
    assert get("s3stream_spark_commit_latency_seconds_count") == 1
    # no engine attached: its series are there, at zero
    assert get("s3stream_append_bytes_total") == 0
    assert get("s3stream_streams_open") == 0


def test_error_status_is_the_http_status_or_a_short_class() -> None:
    assert error_status(_ClientError(404)) == "404"
    assert error_status(TimeoutError()) == "timeout"
    assert error_status(ConnectionRefusedError()) == "connection"
    assert error_status(asyncio.CancelledError()) == "cancelled"
    assert error_status(ValueError("x")) == "ValueError"


def test_a_multi_bucket_storage_has_every_bucket_metered() -> None:
    from s3stream.buckets.build import build_multi_bucket_storage
    from s3stream.config import Config

    storage = build_multi_bucket_storage("0@mem://metrics-a,1@mem://metrics-b", Config())
    metrics = NodeMetrics(node_id=1)
    metrics.attach_storage(storage)
    backends = storage.backends()
    assert all(isinstance(b, MemoryObjectStorage) for b in backends.values())
    inner = [
        (str(bucket_id), b.stats) for bucket_id, b in backends.items() if isinstance(b, MemoryObjectStorage)
    ]
    assert [bucket for bucket, _ in inner] == ["0", "1"]
    assert metrics.storage_stats == inner
    assert metrics.bucket_health is storage.health
    for _ in range(storage.health.errors_max):
        storage.health.record_error(1, TimeoutError(), write=True)
    samples = _samples(metrics)
    assert samples[("s3stream_bucket_healthy", frozenset({("node", "1"), ("bucket", "0")}))] == 1
    assert samples[("s3stream_bucket_healthy", frozenset({("node", "1"), ("bucket", "1")}))] == 0
