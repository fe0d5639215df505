"""``s3stream top``: rates and percentiles from two scrapes of real HTTP endpoints, and nodes that are down.

The fake node is a ``prometheus_client`` registry served by its own HTTP server, holding the metric
names of the metrics contract. Its first collector moves the counters at the second scrape, so the
window ``top --once`` measures holds exactly the workload below, whatever the machine's speed.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from s3stream.cli import main
from s3stream.cli._top_scrape import Scrape, endpoint_url, parse_exposition
from s3stream.cli._top_view import node_view, quantile
from s3stream.errors import InvalidArgumentError

INTERVAL_S = 0.5
APPENDS = 1000
APPEND_BYTES = 64 * 1024 * 1024
PUTS_OK, PUTS_503, GETS_OK = 100, 10, 40
BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.05, 0.1)


class _Mover(Collector):
    """Registered first: at the ``at``-th collect it runs ``move`` before the metrics are read."""

    def __init__(self, move: Callable[[], None], at: int = 2) -> None:
        self.calls = 0
        self.move = move
        self.at = at

    def describe(self) -> Iterable[Metric]:
        return []  # registering must not count as a collect

    def collect(self) -> Iterable[Metric]:
        self.calls += 1
        if self.calls == self.at:
            self.move()
        return []


@dataclass
class FakeNode:
    url: str
    mover: _Mover


def _workload(m: dict[str, object]) -> None:
    appends: Counter = m["appends"]  # type: ignore[assignment]
    appends.labels(outcome="ok").inc(APPENDS - 5)
    appends.labels(outcome="error").inc(5)
    m["append_bytes"].inc(APPEND_BYTES)  # type: ignore[attr-defined]
    latency: Histogram = m["latency"]  # type: ignore[assignment]
    for _ in range(50):
        latency.observe(0.0015)  # (0.001, 0.002]
    for _ in range(49):
        latency.observe(0.004)  # (0.002, 0.005]
    latency.observe(0.07)  # (0.05, 0.1]
    s3: Counter = m["s3"]  # type: ignore[assignment]
    s3.labels(operation="put", status="ok").inc(PUTS_OK)
    s3.labels(operation="put", status="503").inc(PUTS_503)
    s3.labels(operation="get", status="ok").inc(GETS_OK)
    m["fetch"].labels(source="log_cache").inc(200)  # type: ignore[attr-defined]
    m["fetch"].labels(source="s3").inc(20)  # type: ignore[attr-defined]


def _serve(node_id: str = "7") -> Iterator[FakeNode]:
    registry = CollectorRegistry(auto_describe=True)
    m: dict[str, object] = {}
    mover = _Mover(lambda: _workload(m))
    registry.register(mover)
    labels = ["node"]
    m["appends"] = Counter("s3stream_append_requests", "appends", ["outcome"], registry=registry)
    m["append_bytes"] = Counter("s3stream_append_bytes", "bytes", registry=registry)
    m["latency"] = Histogram("s3stream_append_latency_seconds", "lat", registry=registry, buckets=BUCKETS)
    m["s3"] = Counter("s3stream_s3_requests", "s3", ["operation", "status"], registry=registry)
    m["fetch"] = Counter("s3stream_fetch_requests", "fetch", ["source"], registry=registry)
    wal_used = Gauge("s3stream_wal_used_bytes", "u", labels, registry=registry)
    wal_cap = Gauge("s3stream_wal_capacity_bytes", "c", labels, registry=registry)
    wal_used.labels(node=node_id).set(256 * 1024 * 1024)
    wal_cap.labels(node=node_id).set(1024 * 1024 * 1024)
    Gauge("s3stream_upload_backlog_bytes", "b", registry=registry).set(3 * 1024 * 1024)
    Gauge("s3stream_node_epoch", "e", registry=registry).set(12)
    # prior traffic: only the window's deltas may count
    m["appends"].labels(outcome="ok").inc(123456)  # type: ignore[attr-defined]
    m["latency"].observe(9.0)  # type: ignore[attr-defined]
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        yield FakeNode(f"127.0.0.1:{server.server_port}", mover)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture
def fake_node() -> Iterator[FakeNode]:
    yield from _serve()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _row(out: str, first: str) -> list[str]:
    """The cells (split at two or more spaces) of the output line whose first cell is ``first``."""
    for line in out.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if cells and cells[0] == first:
            return cells
    raise AssertionError(f"no line starting with {first!r} in:\n{out}")


def test_once_shows_the_window_rates_and_percentiles(
    fake_node: FakeNode, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["top", "--once", "--interval", str(INTERVAL_S), fake_node.url])
    out = capsys.readouterr().out
    assert code == 0, out
    assert fake_node.mover.calls == 2
    assert "node 7" in out  # the node label of the series names the node
    assert _row(out, "state") == ["state", "up"]
    appends_per_s = float(_row(out, "appends/s")[1].replace(",", ""))
    # the window is INTERVAL_S plus one scrape: the rate is the workload over a bit more than INTERVAL_S
    assert APPENDS / (INTERVAL_S * 1.6) < appends_per_s <= APPENDS / INTERVAL_S
    window_s = APPENDS / appends_per_s
    assert float(_row(out, "append MiB/s")[1]) == pytest.approx(APPEND_BYTES / (1 << 20) / window_s, rel=0.01)
    assert _row(out, "append p50")[1] == "2ms"  # rank 50 of 100 is the top of (1ms, 2ms]
    assert _row(out, "append p99")[1] == "5ms"  # rank 99 is the top of (2ms, 5ms]
    assert float(_row(out, "append errors/s")[1]) == pytest.approx(5 / window_s, rel=0.02)
    assert _row(out, "WAL fill")[1] == "25.0%"
    assert _row(out, "upload backlog")[1] == "3.0MiB"
    assert _row(out, "epoch")[1] == "12"
    assert _row(out, "uploads/s")[1] == "-"  # not exported by this node: unknown, not zero
    s3_total = float(_row(out, "S3 requests/s")[1])
    assert s3_total == pytest.approx((PUTS_OK + PUTS_503 + GETS_OK) / window_s, rel=0.02)
    assert float(_row(out, "S3 errors/s")[1]) == pytest.approx(PUTS_503 / window_s, rel=0.05)
    fetch_rows = [re.split(r"\s{2,}", line.strip()) for line in out.splitlines() if "  log_cache  " in line]
    assert fetch_rows == [["node 7", "log_cache", fetch_rows[0][2], "-", "-"]]
    assert float(fetch_rows[0][2]) == pytest.approx(200 / window_s, rel=0.02)
    s3_rows = [re.split(r"\s{2,}", line.strip()) for line in out.splitlines() if "  put  " in line]
    assert len(s3_rows) == 1, out
    assert float(s3_rows[0][3]) == pytest.approx(PUTS_503 / window_s, rel=0.05)
    assert "S3 requests by operation" in out


def test_a_node_that_is_down_shows_as_down_beside_one_that_is_up(
    fake_node: FakeNode, capsys: pytest.CaptureFixture[str]
) -> None:
    dead = f"127.0.0.1:{_free_port()}"
    code = main(["top", "--once", "--interval", "0.2", dead, fake_node.url])
    out = capsys.readouterr().out
    assert code == 1
    state = _row(out, "state")
    assert state[1].startswith("down: ")
    assert state[2] == "up"
    assert dead in out


def test_an_endpoint_that_answers_something_else_is_down_not_a_crash(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import http.server
    import threading

    class NotMetrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), NotMetrics)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        code = main(["top", "--once", "--interval", "0.1", f"127.0.0.1:{server.server_port}"])
    finally:
        server.shutdown()
        server.server_close()
    out = capsys.readouterr().out
    assert code == 1
    assert "down: HTTP 404" in out


def test_quantile_interpolates_inside_the_bucket() -> None:
    buckets = [(0.1, 10.0), (0.2, 30.0), (float("inf"), 40.0)]
    assert quantile(0.25, buckets) == pytest.approx(0.1)
    assert quantile(0.5, buckets) == pytest.approx(0.15)
    assert quantile(0.99, buckets) == pytest.approx(0.2)  # in +Inf: the highest finite bound
    assert quantile(0.5, [(0.1, 0.0), (float("inf"), 0.0)]) is None
    assert quantile(0.5, []) is None


def test_a_counter_that_went_down_counts_from_zero() -> None:
    text_before = "# TYPE s3stream_append_requests_total counter\ns3stream_append_requests_total 5000\n"
    text_after = "# TYPE s3stream_append_requests_total counter\ns3stream_append_requests_total 30\n"
    prev = Scrape("u", 10.0, parse_exposition(text_before))
    cur = Scrape("u", 12.0, parse_exposition(text_after))
    assert node_view(prev, cur).appends_per_s == pytest.approx(15.0)


def test_a_first_scrape_shows_gauges_but_no_rates() -> None:
    text = (
        '# TYPE s3stream_log_cache_bytes gauge\ns3stream_log_cache_bytes{node="3"} 2048\n'
        "# TYPE s3stream_append_requests_total counter\ns3stream_append_requests_total 9\n"
    )
    cur = Scrape("u", 1.0, parse_exposition(text))
    view = node_view(Scrape("u", 1.0, error="first scrape"), cur)
    assert view.up
    assert view.node == "3"
    assert view.log_cache_bytes == 2048
    assert view.appends_per_s is None


@pytest.mark.parametrize(
    ("given", "url"),
    [
        ("127.0.0.1:9464", "http://127.0.0.1:9464/metrics"),
        ("http://h:1", "http://h:1/metrics"),
        ("http://h:1/", "http://h:1/metrics"),
        ("https://h/custom", "https://h/custom"),
    ],
)
def test_endpoint_urls(given: str, url: str) -> None:
    assert endpoint_url(given) == url


def test_a_bad_endpoint_or_interval_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(InvalidArgumentError):
        endpoint_url("ftp://h/x")
    assert main(["top", "--once", "--interval", "0", "127.0.0.1:1"]) == 2
    assert "--interval" in capsys.readouterr().err
