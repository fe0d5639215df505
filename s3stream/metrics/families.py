"""The metric definitions: every series s3stream exports, built from a node's state at scrape time.

Names follow Prometheus' conventions: the ``s3stream_`` prefix, base units in the name (bytes,
seconds), counters ending in ``_total``, latencies as histograms. Every series carries the constant
label ``node``. ``docs/operations.md`` says what each means and what healthy looks like.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import TypeAlias

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from s3stream.metrics.instruments import Histogram
from s3stream.metrics.node import FETCH_SOURCES, STORAGE_BYTES_DIRECTION, UPLOAD_KINDS, NodeMetrics


class NodeCollector(Collector):
    """Yields the families of one :class:`NodeMetrics` (registered in that node's registry only)."""

    def __init__(self, metrics: NodeMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        m = self.metrics
        node = m.node
        yield from _appends(m, node)
        yield from _fetches(m, node)
        yield from _wal_and_caches(m, node)
        yield from _uploads(m, node)
        yield from _storage(m, node)
        yield from _compaction(m, node)
        yield from _node(m, node)
        yield from _spark(m, node)
        if m.level == "DEBUG":
            yield from _streams(m, node)


def _counter(name: str, doc: str, node: str, value: float) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=["node"])
    family.add_metric([node], value)
    return family


def _gauge(name: str, doc: str, node: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=["node"])
    family.add_metric([node], value)
    return family


Rows: TypeAlias = Iterable[tuple[Sequence[str], float]]
"""(label values after ``node``, value) of each series of a family."""


def _labelled_counter(
    name: str, doc: str, node: str, labels: Sequence[str], rows: Rows
) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=["node", *labels])
    _fill(family, node, rows)
    return family


def _labelled_gauge(name: str, doc: str, node: str, labels: Sequence[str], rows: Rows) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=["node", *labels])
    _fill(family, node, rows)
    return family


def _fill(family: CounterMetricFamily | GaugeMetricFamily, node: str, rows: Rows) -> None:
    for label_values, value in rows:
        family.add_metric([node, *label_values], value)


def _histogram(
    name: str, doc: str, node: str, labels: Sequence[str], rows: Iterable[tuple[Sequence[str], Histogram]]
) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, doc, labels=["node", *labels])
    for values, hist in rows:
        buckets, total = hist.snapshot()
        family.add_metric([node, *values], buckets, total)
    return family


def _appends(m: NodeMetrics, node: str) -> Iterator[Metric]:
    engine = m.engine
    stats = engine.stats if engine is not None else None
    yield _labelled_counter(
        "s3stream_append_requests_total",
        "Record batches appended, by outcome (ok: acknowledged; error: its append call raised).",
        node,
        ["outcome"],
        [
            (["ok"], stats.appended_records if stats is not None else 0),
            (["error"], stats.append_errors if stats is not None else 0),
        ],
    )
    yield _counter(
        "s3stream_append_bytes_total",
        "Payload bytes of acknowledged appends.",
        node,
        stats.appended_bytes if stats is not None else 0,
    )
    yield _histogram(
        "s3stream_append_latency_seconds",
        "From the append call to its acknowledgement (durable in the WAL, in offset order); sampled: one "
        "append in 16 is timed, so _count is the sample count (the rate is s3stream_append_requests_total).",
        node,
        [],
        [([], m.append_latency)],
    )
    yield _counter(
        "s3stream_append_backpressure_waits_total",
        "Appends that waited for LogCache or WAL room (uploads behind).",
        node,
        stats.backpressure_waits if stats is not None else 0,
    )
    yield _counter(
        "s3stream_append_backpressure_wait_seconds_total",
        "Seconds appends spent waiting for room.",
        node,
        stats.backpressure_wait_s if stats is not None else 0.0,
    )
    yield _counter(
        "s3stream_append_capacity_errors_total",
        "Appends refused with CapacityError after the back-pressure wait.",
        node,
        stats.backpressure_rejections if stats is not None else 0,
    )


def _fetches(m: NodeMetrics, node: str) -> Iterator[Metric]:
    meters = [(source, m.fetches[source]) for source in FETCH_SOURCES]
    yield _labelled_counter(
        "s3stream_fetch_requests_total",
        "Fetches by where they were served: log_cache, block_cache or s3.",
        node,
        ["source"],
        [([s], f.requests) for s, f in meters],
    )
    yield _labelled_counter(
        "s3stream_fetch_bytes_total",
        "Payload bytes fetched, by source.",
        node,
        ["source"],
        [([s], f.bytes) for s, f in meters],
    )
    yield _histogram(
        "s3stream_fetch_latency_seconds",
        "Fetch latency, by source.",
        node,
        ["source"],
        [([s], f.latency) for s, f in meters],
    )


def _wal_and_caches(m: NodeMetrics, node: str) -> Iterator[Metric]:
    engine = m.engine
    wal_stats = dict(m.wal_stats) if m.wal_stats is not None else {}
    yield _gauge(
        "s3stream_wal_used_bytes",
        "WAL bytes of records not yet uploaded (what a restart would replay).",
        node,
        engine.wal_pending_bytes if engine is not None else 0,
    )
    yield _gauge(
        "s3stream_wal_capacity_bytes",
        "The WAL's size (s3.wal.capacity).",
        node,
        engine.config.wal_capacity_bytes if engine is not None else 0,
    )
    yield _counter("s3stream_wal_writes_total", "WAL group writes.", node, wal_stats.get("groups", 0))
    yield _histogram(
        "s3stream_wal_write_latency_seconds",
        "A WAL group write, from its hand-over to the device to its completion on the event loop.",
        node,
        [],
        [([], m.wal_write_latency)],
    )
    yield _counter(
        "s3stream_wal_write_bytes_total",
        "Bytes written by WAL group writes (headers and padding included).",
        node,
        wal_stats.get("bytes_written", 0),
    )
    yield _gauge(
        "s3stream_log_cache_bytes",
        "Bytes held by the LogCache (uploaded blocks kept for reads included).",
        node,
        engine.cache.size_bytes if engine is not None else 0,
    )
    yield _gauge(
        "s3stream_block_cache_bytes",
        "Bytes held by the read path's block cache.",
        node,
        m.block_cache.used_bytes if m.block_cache is not None else 0,
    )


def _uploads(m: NodeMetrics, node: str) -> Iterator[Metric]:
    engine = m.engine
    backlog_bytes = 0
    oldest_age_s = 0.0
    if engine is not None:
        blocks = list(engine.cache.blocks)
        waiting = [b for b in blocks if not b.free and b.size_bytes > 0]
        backlog_bytes = sum(b.size_bytes for b in waiting)
        if waiting:
            oldest_age_s = max(0.0, engine.clock() - min(b.created_at_s for b in waiting))
    yield _gauge(
        "s3stream_upload_backlog_bytes",
        "LogCache bytes not yet committed to object storage.",
        node,
        backlog_bytes,
    )
    yield _gauge(
        "s3stream_upload_oldest_record_age_seconds",
        "Age of the oldest LogCache block not yet committed (0: nothing waits).",
        node,
        oldest_age_s,
    )
    uploads = dict(m.uploads.items())
    yield _labelled_counter(
        "s3stream_uploads_total",
        "Objects uploaded by kind (stream_set, stream_object); outcome error counts failed attempts.",
        node,
        ["kind", "outcome"],
        [([k, o], uploads.get((k, o), 0)) for k in UPLOAD_KINDS for o in ("ok", "error")],
    )
    upload_bytes = dict(m.upload_bytes.items())
    yield _labelled_counter(
        "s3stream_upload_bytes_total",
        "Object bytes uploaded, by kind.",
        node,
        ["kind"],
        [([k], upload_bytes.get((k,), 0)) for k in UPLOAD_KINDS],
    )
    yield _histogram(
        "s3stream_upload_latency_seconds",
        "Writing one upload's objects (one attempt), by kind.",
        node,
        ["kind"],
        [([k], m.upload_latency[k]) for k in UPLOAD_KINDS],
    )
    commits = dict(m.commits.items())
    yield _labelled_counter(
        "s3stream_commits_total",
        "Metadata commits of uploads (attempts), by outcome.",
        node,
        ["outcome"],
        [([o], commits.get((o,), 0)) for o in ("ok", "error")],
    )
    yield _histogram(
        "s3stream_commit_latency_seconds",
        "One successful metadata commit of an upload.",
        node,
        [],
        [([], m.commit_latency)],
    )


def _storage(m: NodeMetrics, node: str) -> Iterator[Metric]:
    ops = [
        (bucket, op, meter)
        for bucket, meters in sorted(dict(m.s3).items())
        for op, meter in sorted(meters.ops.items())
    ]
    yield _labelled_counter(
        "s3stream_s3_requests_total",
        "Object storage requests (every attempt), by bucket, operation and status (ok, the HTTP "
        "status, or an error class).",
        node,
        ["bucket", "operation", "status"],
        [
            ([bucket, op, status], n)
            for bucket, op, meter in ops
            for status, n in sorted(dict(meter.statuses).items())
        ],
    )
    yield _histogram(
        "s3stream_s3_request_latency_seconds",
        "One request attempt, by bucket and operation.",
        node,
        ["bucket", "operation"],
        [([bucket, op], meter.latency) for bucket, op, meter in ops if meter.latency.count],
    )
    yield _labelled_counter(
        "s3stream_s3_retries_total",
        "Requests retried after a transient failure, by bucket and operation.",
        node,
        ["bucket", "operation"],
        [([bucket, op], meter.retries) for bucket, op, meter in ops if meter.retries or meter.statuses],
    )
    moved: dict[tuple[str, str, str], int] = {}
    for bucket, stats in list(m.storage_stats):
        for op, size in dict(stats.bytes).items():
            direction = STORAGE_BYTES_DIRECTION.get(op)
            if direction is not None:
                moved[(bucket, op, direction)] = moved.get((bucket, op, direction), 0) + size
    yield _labelled_counter(
        "s3stream_s3_bytes_total",
        "Payload bytes sent to (out) or received from (in) object storage, by bucket and operation.",
        node,
        ["bucket", "operation", "direction"],
        [([bucket, op, direction], n) for (bucket, op, direction), n in sorted(moved.items())],
    )
    if m.bucket_health is not None:
        yield _labelled_gauge(
            "s3stream_bucket_healthy",
            "1 while this node writes to the bucket, 0 while it avoids it (failed requests or probes).",
            node,
            ["bucket"],
            [([str(b)], 1.0 if healthy else 0.0) for b, healthy in sorted(m.bucket_health.healthy().items())],
        )


def _compaction(m: NodeMetrics, node: str) -> Iterator[Metric]:
    kinds = UPLOAD_KINDS
    runs = dict(m.compaction_runs.items())
    yield _labelled_counter(
        "s3stream_compaction_runs_total",
        "Compaction passes by kind (stream_set, stream_object) and outcome.",
        node,
        ["kind", "outcome"],
        [([k, o], runs.get((k, o), 0)) for k in kinds for o in ("ok", "error")],
    )
    for name, doc, counts in (
        (
            "s3stream_compaction_bytes_in_total",
            "Object bytes compaction read (or copied).",
            m.compaction_bytes_in,
        ),
        ("s3stream_compaction_bytes_out_total", "Object bytes compaction wrote.", m.compaction_bytes_out),
        ("s3stream_compaction_objects_in_total", "Objects compaction replaced.", m.compaction_objects_in),
        ("s3stream_compaction_objects_out_total", "Objects compaction wrote.", m.compaction_objects_out),
    ):
        values = dict(counts.items())
        yield _labelled_counter(name, doc, node, ["kind"], [([k], values.get((k,), 0)) for k in kinds])
    yield _counter(
        "s3stream_gc_deleted_objects_total",
        "Objects deleted from the bucket by GC.",
        node,
        m.gc_deleted_objects,
    )
    yield _counter(
        "s3stream_gc_deleted_bytes_total",
        "Object bytes deleted from the bucket by GC.",
        node,
        m.gc_deleted_bytes,
    )


def _node(m: NodeMetrics, node: str) -> Iterator[Metric]:
    heartbeat = m.heartbeat
    engine = m.engine
    remaining_s = 0.0
    epoch = engine.node_epoch if engine is not None else 0
    if heartbeat is not None:
        epoch = heartbeat.node_epoch
        if heartbeat.fenced is None:
            remaining_s = max(0.0, heartbeat.lease_deadline_s - heartbeat.clock())
    yield _gauge(
        "s3stream_node_lease_remaining_seconds",
        "Seconds until this node's lease ends without a renewal (0: lost or fenced).",
        node,
        remaining_s,
    )
    yield _gauge("s3stream_node_epoch", "This node session's epoch.", node, epoch)
    yield _gauge(
        "s3stream_streams_open",
        "Streams open on this node.",
        node,
        len(engine.streams) if engine is not None else 0,
    )


def _spark(m: NodeMetrics, node: str) -> Iterator[Metric]:
    batches = m.spark_batches.items()
    yield _labelled_counter(
        "s3stream_spark_batches_total",
        "Spark sink micro-batches by path (direct, driver) and outcome (committed, skipped, error).",
        node,
        ["path", "outcome"],
        [(list(labels), n) for labels, n in sorted(batches)],
    )
    yield _counter("s3stream_spark_rows_total", "Rows of committed Spark micro-batches.", node, m.spark_rows)
    yield _histogram(
        "s3stream_spark_commit_latency_seconds",
        "A Spark micro-batch's commit (the metadata transaction that makes it visible).",
        node,
        [],
        [([], m.spark_commit_latency)],
    )


def _streams(m: NodeMetrics, node: str) -> Iterator[Metric]:
    meters = sorted(dict(m.streams).items())
    yield _labelled_counter(
        "s3stream_stream_append_requests_total",
        "Acknowledged appends per stream (DEBUG level).",
        node,
        ["stream"],
        [([str(s)], meter.requests) for s, meter in meters],
    )
    yield _labelled_counter(
        "s3stream_stream_append_bytes_total",
        "Acknowledged payload bytes per stream (DEBUG level).",
        node,
        ["stream"],
        [([str(s)], meter.bytes) for s, meter in meters],
    )
    engine = m.engine
    handles = list(engine.streams.values()) if engine is not None else []
    family = GaugeMetricFamily(
        "s3stream_stream_confirm_offset",
        "Per open stream: the offset below which every record is acknowledged (DEBUG level).",
        labels=["node", "stream"],
    )
    for handle in handles:
        family.add_metric([node, str(handle.stream_id)], handle.confirm_offset)
    yield family
