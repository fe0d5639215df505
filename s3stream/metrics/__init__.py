"""Prometheus metrics of a client: off by default, on with ``s3.telemetry.metrics.exporter.uri``.

- :mod:`~s3stream.metrics.uri`: the two configuration keys (exporter URI, level).
- :mod:`~s3stream.metrics.instruments`: the cheap histogram and counters the hot paths update.
- :mod:`~s3stream.metrics.node`: one node's instruments, hooks and engine wrappers.
- :mod:`~s3stream.metrics.families`: the metric definitions, built at scrape time.
- :mod:`~s3stream.metrics.exporter`: the HTTP endpoint.
- :mod:`~s3stream.metrics.noop`: the twin used when metrics are off.
- :mod:`~s3stream.metrics.setup`: :func:`start_metrics`, what the assembly calls.
"""

from s3stream.metrics.node import NodeMetrics
from s3stream.metrics.noop import NOOP_METRICS, NoopMetrics
from s3stream.metrics.setup import Metrics, start_metrics
from s3stream.metrics.uri import ExporterAddress, parse_exporter_uri, parse_level

__all__ = [
    "NOOP_METRICS",
    "ExporterAddress",
    "Metrics",
    "NodeMetrics",
    "NoopMetrics",
    "parse_exporter_uri",
    "parse_level",
    "start_metrics",
]
