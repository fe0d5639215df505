"""What ``s3stream top`` shows of one node, computed from two scrapes, and the tables it draws.

Pure: two :class:`~s3stream.cli._top_scrape.Scrape` values in, a :class:`NodeView` out; rates are
counter deltas over the time between the scrapes, percentiles come from the histogram's bucket
deltas (the same linear interpolation inside a bucket as PromQL's ``histogram_quantile``). A counter
that went down (the node restarted) counts from zero. Gauges are the newer scrape's values. A
figure the node does not export (metrics of a part it does not run) is None and shows as ``-``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from rich.console import Group
from rich.table import Table
from rich.text import Text

from s3stream.cli._top_scrape import Scrape

MiB = 1024 * 1024
P = "s3stream_"


@dataclass(frozen=True)
class SourceRow:
    """A rate broken down by one label value (a fetch source, an S3 operation)."""

    name: str
    requests_per_s: float
    errors_per_s: float | None = None
    mib_per_s: float | None = None
    p99_s: float | None = None


@dataclass(frozen=True)
class NodeView:
    """One node's line in ``top``. ``up`` False: ``error`` says why and every figure is None."""

    url: str
    up: bool
    error: str | None = None
    node: str | None = None
    interval_s: float | None = None
    appends_per_s: float | None = None
    append_errors_per_s: float | None = None
    append_mib_per_s: float | None = None
    append_p50_s: float | None = None
    append_p99_s: float | None = None
    backpressure_waits_per_s: float | None = None
    capacity_errors_per_s: float | None = None
    fetches_per_s: float | None = None
    upload_backlog_bytes: float | None = None
    upload_oldest_age_s: float | None = None
    uploads_per_s: float | None = None
    upload_errors_per_s: float | None = None
    wal_fill_pct: float | None = None
    log_cache_bytes: float | None = None
    block_cache_bytes: float | None = None
    s3_requests_per_s: float | None = None
    s3_errors_per_s: float | None = None
    compaction_in_mib_per_s: float | None = None
    compaction_out_mib_per_s: float | None = None
    gc_deleted_per_s: float | None = None
    lease_remaining_s: float | None = None
    epoch: float | None = None
    streams_open: float | None = None
    fetch_sources: tuple[SourceRow, ...] = field(default_factory=tuple)
    s3_operations: tuple[SourceRow, ...] = field(default_factory=tuple)


def _delta(prev: Scrape, cur: Scrape, name: str, **labels: str) -> float | None:
    now = cur.total(name, **labels)
    if now is None:
        return None
    before = prev.total(name, **labels)
    if before is None or now < before:  # new series, or the node restarted: its counters start over
        return now
    return now - before


def _rate(prev: Scrape, cur: Scrape, dt_s: float, name: str, **labels: str) -> float | None:
    d = _delta(prev, cur, name, **labels)
    return None if d is None else d / dt_s


def _bucket_deltas(prev: Scrape, cur: Scrape, name: str, **labels: str) -> list[tuple[float, float]]:
    """(upper bound, cumulative count delta) of histogram ``name``'s buckets, by bound; summed over
    the series that match ``labels``."""
    bounds = {lbl["le"] for lbl, _ in cur.samples.get(f"{name}_bucket", ()) if "le" in lbl}
    out = []
    for le in bounds:
        d = _delta(prev, cur, f"{name}_bucket", le=le, **labels)
        if d is not None:
            out.append((float(le), d))
    return sorted(out)


def quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """The ``q`` quantile of cumulative ``buckets`` ((upper bound, count) by bound, the last +Inf),
    interpolated linearly inside its bucket; None when no observation fell in the window. A rank in
    the +Inf bucket gives the highest finite bound."""
    assert 0.0 <= q <= 1.0
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank and count > below:
            if math.isinf(bound):
                return lower
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return lower


def _percentile(prev: Scrape, cur: Scrape, q: float, name: str, **labels: str) -> float | None:
    return quantile(q, _bucket_deltas(prev, cur, name, **labels))


def _plus(*values: float | None) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _mib(value: float | None) -> float | None:
    return None if value is None else value / MiB


def node_view(prev: Scrape, cur: Scrape) -> NodeView:
    """The view of one node from two scrapes of it (``prev`` the older)."""
    if not cur.up:
        return NodeView(url=cur.url, up=False, error=cur.error)
    node = next((lbl["node"] for series in cur.samples.values() for lbl, _ in series if "node" in lbl), None)
    gauge = cur.total
    used, capacity = gauge(f"{P}wal_used_bytes"), gauge(f"{P}wal_capacity_bytes")
    fill = None if used is None or not capacity else 100.0 * used / capacity
    common = {
        "url": cur.url,
        "up": True,
        "node": node,
        "upload_backlog_bytes": gauge(f"{P}upload_backlog_bytes"),
        "upload_oldest_age_s": gauge(f"{P}upload_oldest_record_age_seconds"),
        "wal_fill_pct": fill,
        "log_cache_bytes": gauge(f"{P}log_cache_bytes"),
        "block_cache_bytes": gauge(f"{P}block_cache_bytes"),
        "lease_remaining_s": gauge(f"{P}node_lease_remaining_seconds"),
        "epoch": gauge(f"{P}node_epoch"),
        "streams_open": gauge(f"{P}streams_open"),
    }
    dt_s = cur.at_s - prev.at_s
    if not prev.up or dt_s <= 0:  # no window to take rates over yet
        return NodeView(**common)  # type: ignore[arg-type]

    def rate(name: str, **labels: str) -> float | None:
        return _rate(prev, cur, dt_s, name, **labels)

    def pct(q: float, name: str, **labels: str) -> float | None:
        return _percentile(prev, cur, q, name, **labels)

    s3_total = rate(f"{P}s3_requests_total")
    s3_ok = rate(f"{P}s3_requests_total", status="ok")
    sources = tuple(
        SourceRow(
            name=source,
            requests_per_s=rate(f"{P}fetch_requests_total", source=source) or 0.0,
            mib_per_s=_mib(rate(f"{P}fetch_bytes_total", source=source)),
            p99_s=pct(0.99, f"{P}fetch_latency_seconds", source=source),
        )
        for source in cur.label_values(f"{P}fetch_requests_total", "source")
    )
    operations = []
    for op in cur.label_values(f"{P}s3_requests_total", "operation"):
        total = rate(f"{P}s3_requests_total", operation=op) or 0.0
        ok = rate(f"{P}s3_requests_total", operation=op, status="ok") or 0.0
        operations.append(
            SourceRow(
                name=op,
                requests_per_s=total,
                errors_per_s=max(0.0, total - ok),
                mib_per_s=_mib(rate(f"{P}s3_bytes_total", operation=op)),
                p99_s=pct(0.99, f"{P}s3_request_latency_seconds", operation=op),
            )
        )
    return NodeView(
        **common,  # type: ignore[arg-type]
        interval_s=dt_s,
        appends_per_s=rate(f"{P}append_requests_total"),
        append_errors_per_s=rate(f"{P}append_requests_total", outcome="error"),
        append_mib_per_s=_mib(rate(f"{P}append_bytes_total")),
        append_p50_s=pct(0.5, f"{P}append_latency_seconds"),
        append_p99_s=pct(0.99, f"{P}append_latency_seconds"),
        backpressure_waits_per_s=rate(f"{P}append_backpressure_waits_total"),
        capacity_errors_per_s=rate(f"{P}append_capacity_errors_total"),
        fetches_per_s=rate(f"{P}fetch_requests_total"),
        uploads_per_s=rate(f"{P}uploads_total"),
        upload_errors_per_s=rate(f"{P}uploads_total", outcome="error"),
        s3_requests_per_s=s3_total,
        s3_errors_per_s=None if s3_total is None else max(0.0, s3_total - (s3_ok or 0.0)),
        compaction_in_mib_per_s=_mib(rate(f"{P}compaction_bytes_in_total")),
        compaction_out_mib_per_s=_mib(rate(f"{P}compaction_bytes_out_total")),
        gc_deleted_per_s=rate(f"{P}gc_deleted_objects_total"),
        fetch_sources=sources,
        s3_operations=tuple(operations),
    )


# -- text ---------------------------------------------------------------------------------------


def num(value: float | None, digits: int = 1) -> str:
    """A figure for the table: ``-`` when unknown."""
    return "-" if value is None else f"{value:,.{digits}f}"


def duration(value_s: float | None) -> str:
    """Seconds as ``µs``/``ms``/``s`` with three significant figures; ``-`` when unknown."""
    if value_s is None:
        return "-"
    if value_s < 1e-3:
        return f"{value_s * 1e6:.0f}µs"
    if value_s < 1.0:
        return f"{value_s * 1e3:.3g}ms"
    return f"{value_s:.3g}s"


def size(value_bytes: float | None) -> str:
    """Bytes in B/KiB/MiB/GiB; ``-`` when unknown."""
    if value_bytes is None:
        return "-"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value_bytes >= scale:
            return f"{value_bytes / scale:.1f}{unit}"
    return f"{value_bytes:.0f}B"


def _endpoint(view: NodeView) -> str:
    """``host:port`` of the view's URL (scheme and the usual ``/metrics`` path left out)."""
    text = view.url.split("://", 1)[-1]
    return text[: -len("/metrics")] if text.endswith("/metrics") else text


def _node(view: NodeView) -> str:
    return f"node {view.node}" if view.node is not None else _endpoint(view)


def _figures(v: NodeView) -> list[str | Text]:
    """The column of one node in the main table, in :data:`FIGURES` order."""
    if not v.up:
        return [Text(f"down: {v.error}", style="bold red"), *["-"] * (len(FIGURES) - 1)]
    return [
        Text("up", style="green"),
        num(v.appends_per_s),
        num(v.append_mib_per_s, 2),
        duration(v.append_p50_s),
        duration(v.append_p99_s),
        num(_plus(v.append_errors_per_s, v.capacity_errors_per_s)),
        num(v.backpressure_waits_per_s),
        num(v.fetches_per_s),
        size(v.upload_backlog_bytes),
        duration(v.upload_oldest_age_s),
        num(v.uploads_per_s, 2),
        num(v.upload_errors_per_s, 2),
        "-" if v.wal_fill_pct is None else f"{v.wal_fill_pct:.1f}%",
        size(v.log_cache_bytes),
        size(v.block_cache_bytes),
        num(v.s3_requests_per_s),
        Text(num(v.s3_errors_per_s), style="red" if v.s3_errors_per_s else ""),
        num(v.compaction_in_mib_per_s, 2),
        num(v.compaction_out_mib_per_s, 2),
        num(v.gc_deleted_per_s),
        duration(v.lease_remaining_s),
        num(v.epoch, 0),
        num(v.streams_open, 0),
    ]


FIGURES = (
    "state", "appends/s", "append MiB/s", "append p50", "append p99", "append errors/s",
    "backpressure waits/s", "fetches/s", "upload backlog", "oldest un-uploaded", "uploads/s",
    "upload errors/s", "WAL fill", "LogCache", "block cache", "S3 requests/s", "S3 errors/s",
    "compaction in MiB/s", "compaction out MiB/s", "GC deletions/s", "lease remaining", "epoch",
    "streams open",
)  # fmt: skip
"""The rows of the main table: one per figure, one column per node."""


def render(views: Sequence[NodeView], *, title: str) -> Group:
    """The frame: a row per figure with a column per node, then fetches by source and S3 requests by
    operation (a row per node and source/operation)."""
    nodes = Table(box=None, pad_edge=False)
    nodes.add_column("", no_wrap=True)
    for v in views:
        nodes.add_column(f"{_node(v)}\n{_endpoint(v)}", justify="right", overflow="fold")
    columns = [_figures(v) for v in views]
    for i, figure in enumerate(FIGURES):
        nodes.add_row(figure, *(column[i] for column in columns))
    parts: list[Table | Text] = [Text(title, style="bold"), nodes]
    fetches = Table(title="fetches by source", title_justify="left", box=None, pad_edge=False)
    for header in ("node", "source", "req/s", "MiB/s", "p99"):
        fetches.add_column(header, no_wrap=True, justify="left" if header in ("node", "source") else "right")
    s3 = Table(title="S3 requests by operation", title_justify="left", box=None, pad_edge=False)
    for header in ("node", "operation", "req/s", "err/s", "MiB/s", "p99"):
        s3.add_column(header, no_wrap=True, justify="left" if header in ("node", "operation") else "right")
    for v in views:
        for row in v.fetch_sources:
            fetches.add_row(
                _node(v), row.name, num(row.requests_per_s), num(row.mib_per_s, 2), duration(row.p99_s)
            )
        for row in v.s3_operations:
            s3.add_row(
                _node(v), row.name, num(row.requests_per_s), num(row.errors_per_s), num(row.mib_per_s, 2),
                duration(row.p99_s),
            )  # fmt: skip
    if fetches.row_count:
        parts.append(fetches)
    if s3.row_count:
        parts.append(s3)
    return Group(*parts)
