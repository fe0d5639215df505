"""``s3stream top URL...``: a live view of one or more nodes from their Prometheus metrics endpoints.

Each URL is a node's endpoint (``host:port``, ``http://host:port`` or ``http://host:port/metrics``;
a node serves one when ``s3.telemetry.metrics.exporter.uri`` is set). Every ``--interval`` seconds
(default 2) every endpoint is scraped at once and the view is redrawn: per node the append rate,
MiB/s and p50/p99 latency, append errors and back-pressure waits, fetches, the upload backlog and
the age of its oldest record, uploads, WAL fill, LogCache bytes, S3 requests and errors, compaction
MiB/s, GC deletions, lease remaining and epoch; then fetches by source and S3 requests by
operation. Rates and percentiles are over the last interval (docs/operations.md says what each
figure means). An endpoint that does not answer shows as ``down`` with the reason; the view goes on.

``--once`` scrapes twice, ``--interval`` apart, prints one text frame and exits (0 when every node
answered, 1 when one was down): for scripts and documents. It reads nothing but the endpoints.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from s3stream.cli._top_scrape import Scrape, endpoint_url, scrape
from s3stream.errors import InvalidArgumentError

if TYPE_CHECKING:  # rich is imported when the command runs: the CLI starts without it
    from s3stream.cli._top_view import NodeView

INTERVAL_S_DEFAULT = 2.0
INTERVAL_S_MIN = 0.1
TEXT_WIDTH_MIN = 120
"""Width of a frame printed to something that is not a terminal (the tables are wide)."""


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "top", help="live view of nodes from their metrics endpoints", description=__doc__
    )
    parser.add_argument(
        "urls", nargs="+", metavar="URL", help="metrics endpoint: host:port or http://host:port"
    )
    parser.add_argument(
        "--interval", type=float, default=INTERVAL_S_DEFAULT, help="seconds between scrapes (default 2)"
    )
    parser.add_argument("--once", action="store_true", help="print one frame after two scrapes and exit")
    parser.add_argument(
        "--timeout", type=float, default=None, help="seconds a scrape may take (default: interval)"
    )
    parser.set_defaults(func=run_top)


class Scraper:
    """Scrapes every endpoint at once and keeps the previous scrape of each, for rates."""

    def __init__(self, urls: Sequence[str], *, timeout_s: float) -> None:
        self.urls = list(urls)
        self.timeout_s = timeout_s
        self._previous: dict[str, Scrape] = {}
        self._pool = ThreadPoolExecutor(
            max_workers=min(16, len(self.urls)), thread_name_prefix="s3stream-top"
        )

    def views(self) -> list[NodeView]:
        """Scrape all endpoints; one view per endpoint, in the order given."""
        from s3stream.cli._top_view import node_view

        scrapes = list(self._pool.map(lambda url: scrape(url, timeout_s=self.timeout_s), self.urls))
        views = []
        for cur in scrapes:
            prev = self._previous.get(cur.url, Scrape(cur.url, cur.at_s, error="first scrape"))
            views.append(node_view(prev, cur))
            self._previous[cur.url] = cur
        return views

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _title(interval_s: float) -> str:
    return f"s3stream top  {time.strftime('%Y-%m-%d %H:%M:%S')}  rates over {interval_s:g}s"


def run_top(args: argparse.Namespace) -> int:
    if not args.interval >= INTERVAL_S_MIN:
        raise InvalidArgumentError(f"--interval must be at least {INTERVAL_S_MIN} s, got {args.interval}")
    urls = [endpoint_url(u) for u in args.urls]
    timeout_s = args.timeout if args.timeout is not None else max(args.interval, 1.0)
    scraper = Scraper(urls, timeout_s=timeout_s)
    try:
        if args.once:
            return _once(scraper, args.interval)
        return _live(scraper, args.interval)
    finally:
        scraper.close()


def _once(scraper: Scraper, interval_s: float) -> int:
    from rich.console import Console

    from s3stream.cli._top_view import render

    scraper.views()
    time.sleep(interval_s)
    views = scraper.views()
    width = shutil.get_terminal_size((TEXT_WIDTH_MIN, 24)).columns if sys.stdout.isatty() else TEXT_WIDTH_MIN
    console = Console(file=sys.stdout, width=max(width, TEXT_WIDTH_MIN), color_system=None, highlight=False)
    console.print(render(views, title=_title(interval_s)))
    return 0 if all(v.up for v in views) else 1


def _live(scraper: Scraper, interval_s: float) -> int:
    from rich.live import Live

    from s3stream.cli._top_view import render

    frame = render(scraper.views(), title="s3stream top  (first scrape: rates after the next)")
    try:
        with Live(frame, auto_refresh=False, screen=False) as live:
            while True:
                time.sleep(interval_s)
                live.update(render(scraper.views(), title=_title(interval_s)), refresh=True)
    except KeyboardInterrupt:
        return 0
