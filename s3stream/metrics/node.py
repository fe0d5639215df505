"""One node's metrics: the instruments its components update and the components read at scrape time.

A :class:`NodeMetrics` belongs to one client (one ``CollectorRegistry``, so several clients in one
process never share or collide on a series). It is told of events through the hooks the components
expose (an attribute that is None while metrics are off: the upload pipeline's ``meter``, the S3
client's ``request_meter``, the compactor's and the garbage collector's ``meter``) and wraps the
engine's ``append_one`` / ``append`` / ``fetch`` (timed: latency histograms, outcomes). Everything the
components already count (appended bytes, WAL group writes, cache sizes, upload backlog, storage
bytes, lease, epoch) is read when Prometheus scrapes, not on the hot path: :mod:`s3stream.metrics.families`
turns this state into metric families.

Invariant: every instrument is written on the event loop's thread only; the exporter's thread only
reads (copies of dicts and lists, taken in one C call each).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from s3stream.buckets.health import BucketHealth
from s3stream.metrics.instruments import Histogram, LabelledCounts
from s3stream.metrics.uri import MetricsLevel
from s3stream.storage.stats import StorageStats

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from compaction.compactor import Compactor
    from compaction.gc import GarbageCollector
    from s3stream.engine.blockcache import BlockCache
    from s3stream.engine.core import Engine
    from s3stream.engine.heartbeat import Heartbeat
    from s3stream.engine.stream import StreamHandle
    from s3stream.model import FetchedBatch

AppendOne = Callable[["StreamHandle", bytes, int], Coroutine[Any, Any, int]]
"""The engine's ``append_one``."""
FETCH_SOURCES = ("log_cache", "block_cache", "s3")
UPLOAD_KINDS = ("stream_set", "stream_object")
S3_OPERATIONS = {
    "PUT": "put",
    "GET": "get",
    "HEAD": "head",
    "DELETE": "delete",
    "LIST": "list",
    "ListMultipartUploads": "list",
    "CreateMultipartUpload": "create_multipart",
    "UploadPart": "upload_part",
    "UploadPartCopy": "upload_part_copy",
    "CompleteMultipartUpload": "complete_multipart",
    "AbortMultipartUpload": "abort_multipart",
}
"""The S3 client's call names -> the ``operation`` label (any other name: ``other``)."""
STORAGE_BYTES_DIRECTION = {
    "put": "out",
    "upload_part": "out",
    "get": "in",
}
"""StorageStats byte counters that are payload sent to (out) or received from (in) object storage.
Server-side copies (``copy``, ``upload_part_copy``) move no payload through this process."""


@dataclass(slots=True)
class FetchMeter:
    """Fetches served from one source."""

    requests: int = 0
    bytes: int = 0
    latency: Histogram = field(default_factory=Histogram)


@dataclass(slots=True)
class S3OpMeter:
    """Attempts of one S3 operation: by status, timed, and the retries among them."""

    statuses: dict[str, int] = field(default_factory=dict)
    latency: Histogram = field(default_factory=Histogram)
    retries: int = 0


class BucketRequests:
    """The request meter of one bucket's S3 client (its ``request_meter``): every attempt of every
    call, by operation."""

    __slots__ = ("ops",)

    def __init__(self) -> None:
        self.ops: dict[str, S3OpMeter] = {name: S3OpMeter() for name in {*S3_OPERATIONS.values(), "other"}}

    def attempted(self, op: str, error: BaseException | None, seconds: float) -> None:
        meter = self.ops[S3_OPERATIONS.get(op, "other")]
        status = "ok" if error is None else error_status(error)
        statuses = meter.statuses
        statuses[status] = statuses.get(status, 0) + 1
        meter.latency.observe(seconds)

    def retried(self, op: str) -> None:
        self.ops[S3_OPERATIONS.get(op, "other")].retries += 1


@dataclass(slots=True)
class StreamMeter:
    """A stream's appends (DEBUG level only)."""

    requests: int = 0
    bytes: int = 0


class NodeMetrics:
    """The metrics of one node (one client); see the module docstring. ``endpoint`` is set by the
    exporter once it listens."""

    enabled = True

    def __init__(self, *, node_id: int, level: MetricsLevel = "INFO") -> None:
        self.node = str(node_id)
        self.level: MetricsLevel = level
        self.endpoint: str | None = None
        self.registry: CollectorRegistry | None = None
        """This node's own registry (set by :func:`~s3stream.metrics.setup.start_metrics`)."""
        # appends (counts: the engine's stats)
        self.append_latency = Histogram()
        """Sampled: one append in 16 (:data:`~s3stream.engine.append.LATENCY_SAMPLE_MASK`)."""
        self.streams: dict[int, StreamMeter] = {}
        # fetches
        self.fetches = {source: FetchMeter() for source in FETCH_SOURCES}
        # uploads and commits
        self.uploads = LabelledCounts()
        """(kind, outcome) -> objects uploaded (or failed upload attempts)."""
        self.upload_bytes = LabelledCounts()
        self.upload_latency = {kind: Histogram() for kind in UPLOAD_KINDS}
        self.commits = LabelledCounts()
        self.commit_latency = Histogram()
        # object storage
        self.s3: dict[str, BucketRequests] = {}
        """Bucket label -> the request meter of that bucket's client."""
        self.storage_stats: list[tuple[str, StorageStats]] = []
        """(bucket label, byte counters) of each attached backend that keeps them."""
        self.bucket_health: BucketHealth | None = None
        """A multi-bucket storage's health, read at scrape time."""
        # compaction and GC
        self.compaction_runs = LabelledCounts()
        self.compaction_bytes_in = LabelledCounts()
        self.compaction_bytes_out = LabelledCounts()
        self.compaction_objects_in = LabelledCounts()
        self.compaction_objects_out = LabelledCounts()
        self.gc_deleted_objects = 0
        self.gc_deleted_bytes = 0
        # Spark sink (the driver's client)
        self.spark_batches = LabelledCounts()
        self.spark_rows = 0
        self.spark_commit_latency = Histogram()
        # read at scrape time
        self.engine: Engine | None = None
        self.wal_stats: dict[str, int] | None = None
        self.wal_write_latency = Histogram()
        self.block_cache: BlockCache[Any] | None = None
        self.heartbeat: Heartbeat | None = None
        self.closers: list[Callable[[], Awaitable[None]]] = []
        """Stop the exporter (set by :func:`s3stream.metrics.setup.start_metrics`)."""

    async def close(self) -> None:
        """Stop serving; the instruments stay readable."""
        closers, self.closers = self.closers, []
        for closer in reversed(closers):
            await closer()

    # -- wiring (assembly) ----------------------------------------------------------------------
    def attach_engine(self, engine: Engine) -> None:
        """Meter the engine's appends (a sampled latency), fetches and upload steps, and read its
        counters, LogCache and WAL at scrape time. At DEBUG level its ``append_one`` / ``append`` are
        wrapped to count per stream: call before any stream is opened (a stream keeps the
        ``append_one`` it was opened with)."""
        self.engine = engine
        engine.set_meters(append_latency=self.append_latency.observe, upload_step=self.upload_step)
        engine.fetch = self._timed_fetch(engine)  # type: ignore[method-assign]
        if self.level == "DEBUG":
            engine.append_one = self._counted_append_one(engine.append_one)  # type: ignore[assignment]
            engine.append = self._counted_append(engine.append)
        block_wal = getattr(engine.wal, "block_wal", None)
        if block_wal is not None:
            self.wal_stats = block_wal.stats
            block_wal.group_write_s = _ObservedSamples(self.wal_write_latency)
        block_cache = getattr(engine.reader, "block_cache", None)
        if block_cache is not None:
            self.block_cache = block_cache

    def attach_storage(self, storage: object, *, bucket: str = "0") -> None:
        """Meter an S3 backend's requests (every attempt) and read its byte counters
        (:class:`~s3stream.storage.stats.StorageStats`) at scrape time, under the ``bucket`` label; a
        backend without a request meter hook (local, in-memory) reports its byte counters only. A
        storage over several buckets that maps their ids to backends with ``backends()`` has each
        attached under its id, and its ``health`` read at scrape time."""
        backends = getattr(storage, "backends", None)
        if callable(backends):
            for bucket_id, backend in backends().items():
                self.attach_storage(backend, bucket=str(bucket_id))
            health = getattr(storage, "health", None)
            if isinstance(health, BucketHealth):
                self.bucket_health = health
        if hasattr(storage, "request_meter"):
            storage.request_meter = self.s3.setdefault(bucket, BucketRequests())
        stats = getattr(storage, "stats", None)
        if isinstance(stats, StorageStats) and all(stats is not s for _, s in self.storage_stats):
            self.storage_stats.append((bucket, stats))

    def attach_compaction(self, compactor: Compactor | None, collectors: Sequence[GarbageCollector]) -> None:
        if compactor is not None:
            compactor.meter = self.compaction_pass
            compactor.gc.meter = self.gc_deleted
        for collector in collectors:
            collector.meter = self.gc_deleted

    def attach_heartbeat(self, heartbeat: Heartbeat) -> None:
        self.heartbeat = heartbeat

    # -- hooks ----------------------------------------------------------------------------------
    def upload_step(self, step: str, ok: bool, result: object, seconds: float) -> None:
        """The upload pipeline's ``meter``: one attempt of ``prepare``, ``upload`` or ``commit``."""
        if step == "upload":
            if not ok:
                self.uploads.inc(("stream_set", "error"))
                return
            object_id = getattr(result, "object_id", -1)
            stream_objects = getattr(result, "stream_objects", ())
            if object_id >= 0:
                self.uploads.inc(("stream_set", "ok"))
                self.upload_bytes.inc(("stream_set",), getattr(result, "object_size_bytes", 0))
                self.upload_latency["stream_set"].observe(seconds)
            if stream_objects:
                self.uploads.inc(("stream_object", "ok"), len(stream_objects))
                self.upload_bytes.inc(("stream_object",), sum(o.size_bytes for o in stream_objects))
                self.upload_latency["stream_object"].observe(seconds)
        elif step == "commit":
            self.commits.inc(("ok" if ok else "error",))
            if ok:
                self.commit_latency.observe(seconds)

    def compaction_pass(self, kind: str, moved: tuple[int, int, int, int] | None) -> None:
        """The compactor's ``meter``: one pass of a run."""
        if moved is None:
            self.compaction_runs.inc((kind, "error"))
            return
        self.compaction_runs.inc((kind, "ok"))
        bytes_in, bytes_out, objects_in, objects_out = moved
        self.compaction_bytes_in.inc((kind,), bytes_in)
        self.compaction_bytes_out.inc((kind,), bytes_out)
        self.compaction_objects_in.inc((kind,), objects_in)
        self.compaction_objects_out.inc((kind,), objects_out)

    def gc_deleted(self, objects: int, size_bytes: int) -> None:
        """A garbage collector's ``meter``: one batch of objects deleted from the bucket."""
        self.gc_deleted_objects += objects
        self.gc_deleted_bytes += size_bytes

    def spark_batch(self, *, path: str, outcome: str, rows: int, commit_s: float | None) -> None:
        """The Spark sink (driver side): one micro-batch, ``path`` ``direct`` or ``driver``, ``outcome``
        ``committed``, ``skipped`` (already committed: a replay) or ``error``."""
        self.spark_batches.inc((path, outcome))
        if outcome == "committed":
            self.spark_rows += rows
            if commit_s is not None:
                self.spark_commit_latency.observe(commit_s)

    # -- engine wrappers ------------------------------------------------------------------------
    def _counted_append_one(self, inner: AppendOne) -> AppendOne:
        per_stream = self.streams

        async def append_one(handle: StreamHandle, payload: bytes, count: int) -> int:
            base = await inner(handle, payload, count)
            _count_stream(per_stream, handle.stream_id, len(payload))
            return base

        return append_one

    def _counted_append(self, inner: Callable[..., Any]) -> Callable[..., Any]:
        per_stream = self.streams

        async def append(
            appends: Sequence[tuple[StreamHandle, bytes, int]],
            kv_puts: Sequence[tuple[str, bytes]] = (),
            expected_offsets: Sequence[int | None] | None = None,
        ) -> list[int]:
            bases: list[int] = await inner(appends, kv_puts, expected_offsets)
            for handle, payload, _ in appends:
                _count_stream(per_stream, handle.stream_id, len(payload))
            return bases

        return append

    def _timed_fetch(self, engine: Engine) -> Callable[..., Any]:
        """Fetches by where they were served: the LogCache alone (no object read), the block cache
        (an object read with no block cache miss) or S3 (a miss). Concurrent fetches of the same
        engine may see each other's misses: the source is then the costlier one."""
        inner = engine.fetch
        stats = engine.stats
        reader_stats = getattr(engine.reader, "stats", None)
        fetches = self.fetches

        async def fetch(handle: StreamHandle, start_offset: int, end_offset: int, max_bytes: int) -> Any:
            reads = stats.object_reads
            misses = reader_stats().block_miss_count if reader_stats is not None else 0
            started = time.perf_counter()
            records: list[FetchedBatch] = await inner(handle, start_offset, end_offset, max_bytes)
            elapsed = time.perf_counter() - started
            if stats.object_reads == reads:
                meter = fetches["log_cache"]
            elif reader_stats is not None and reader_stats().block_miss_count != misses:
                meter = fetches["s3"]
            else:
                meter = fetches["block_cache"]
            meter.requests += 1
            meter.bytes += sum(len(r.payload) for r in records)
            meter.latency.observe(elapsed)
            return records

        return fetch


def _count_stream(per_stream: dict[int, StreamMeter], stream_id: int, size: int) -> None:
    meter = per_stream.get(stream_id)
    if meter is None:
        meter = per_stream[stream_id] = StreamMeter()
    meter.requests += 1
    meter.bytes += size


def error_status(error: BaseException) -> str:
    """The ``status`` label of a failed attempt: the HTTP status when S3 answered, else a short class
    (``timeout``, ``connection``, ``cancelled``, or the exception's class name)."""
    response = getattr(error, "response", None)
    if isinstance(response, dict):
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if isinstance(status, int):
            return str(status)
    if isinstance(error, TimeoutError):
        return "timeout"
    if isinstance(error, ConnectionError | OSError):
        return "connection"
    name = type(error).__name__
    if name == "CancelledError":
        return "cancelled"
    if "Timeout" in name:
        return "timeout"
    if "Connect" in name or "Endpoint" in name:
        return "connection"
    return name[:40]


class _ObservedSamples(list[float]):
    """Stands in for the WAL's ``group_write_s`` sample list: each appended sample goes into a
    histogram instead of being kept."""

    def __init__(self, histogram: Histogram) -> None:
        super().__init__()
        self._histogram = histogram

    def append(self, value: float) -> None:
        self._histogram.observe(value)
