"""Turning metrics on for one client: a registry of its own, the node's collector, the process
collectors and the HTTP exporter, from the configuration (or the no-op twin when metrics are off)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector

from s3stream.config import Config
from s3stream.metrics.exporter import MetricsExporter
from s3stream.metrics.families import NodeCollector
from s3stream.metrics.node import NodeMetrics
from s3stream.metrics.noop import NOOP_METRICS, NoopMetrics
from s3stream.metrics.uri import parse_exporter_uri, parse_level

Metrics = NodeMetrics | NoopMetrics
"""What a client reports through: the real metrics or the no-op twin."""


def start_metrics(config: Config) -> Metrics:
    """The client's metrics: :data:`~s3stream.metrics.noop.NOOP_METRICS` when
    ``s3.telemetry.metrics.exporter.uri`` is empty, else a :class:`NodeMetrics` whose exporter already
    listens (``metrics.endpoint``; close it with ``await metrics.close()``).

    InvalidArgumentError for a bad URI or level, or an address that cannot be bound."""
    address = parse_exporter_uri(config.metrics_exporter_uri)
    if address is None:
        return NOOP_METRICS
    metrics = NodeMetrics(node_id=config.node_id, level=parse_level(config.metrics_level))
    registry = CollectorRegistry(auto_describe=True)
    registry.register(NodeCollector(metrics))
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    metrics.registry = registry
    exporter = MetricsExporter(registry, address)
    metrics.endpoint = exporter.endpoint
    metrics.closers.append(exporter.close)
    return metrics
