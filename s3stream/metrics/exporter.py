"""The Prometheus endpoint of one client: prometheus_client's WSGI exposition on its own registry.

``GET /metrics`` (and ``/``) answers the registry in the text format (OpenMetrics when the scraper
asks for it); any other path is 404. Each connection is served on its own daemon thread with a
socket timeout, so a slow or silent client holds one thread for at most :data:`CLIENT_TIMEOUT_S` and
never delays another scrape; malformed requests are answered (400) or dropped by the HTTP server
without reaching the registry. The server stops with :meth:`MetricsExporter.close`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from s3stream.errors import InvalidArgumentError
from s3stream.logfmt import log_event
from s3stream.metrics.uri import URI_KEY, ExporterAddress

log = logging.getLogger(__name__)

CLIENT_TIMEOUT_S = 10.0
"""A connection that sends or reads nothing for this long is closed."""
METRICS_PATHS = frozenset({"/metrics", "/"})

StartResponse = Callable[[str, list[tuple[str, str]]], Any]


class _QuietHandler(WSGIRequestHandler):
    """No access log lines on stderr; a bounded wait on each client."""

    timeout = CLIENT_TIMEOUT_S

    def log_message(self, format: str, *args: Any) -> None:
        """Access lines are not logged (a scrape every few seconds would flood the log)."""


class _Server(ThreadingWSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class MetricsExporter:
    """Serves one registry over HTTP on a daemon thread. :attr:`port` is the bound port."""

    def __init__(self, registry: CollectorRegistry, address: ExporterAddress) -> None:
        metrics_app = make_wsgi_app(registry)

        def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
            if environ.get("PATH_INFO", "") not in METRICS_PATHS:
                start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
                return [b"not found: metrics are at /metrics\n"]
            return metrics_app(environ, start_response)  # type: ignore[no-any-return]

        try:
            self._server = make_server(address.host, address.port, app, _Server, handler_class=_QuietHandler)
        except (OSError, OverflowError) as exc:
            raise InvalidArgumentError(
                f"{URI_KEY}: cannot listen on {address.host}:{address.port}: {exc}"
            ) from exc
        self.host = address.host
        self.port: int = self._server.server_port
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.1},
            name="s3stream-metrics",
            daemon=True,
        )
        self._thread.start()
        self._closed = False
        log_event(log, logging.INFO, "metrics.serving", endpoint=self.endpoint)

    @property
    def endpoint(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close_blocking(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    async def close(self) -> None:
        """Stop serving (waits for the serving thread, off the event loop)."""
        await asyncio.to_thread(self.close_blocking)
