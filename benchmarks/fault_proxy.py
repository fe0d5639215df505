"""A fault-injecting HTTP reverse proxy in front of one S3 endpoint, run as a process of its own.

``python -m benchmarks.fault_proxy --listen 127.0.0.1:PORT --upstream http://127.0.0.1:7480`` forwards
every request to the upstream endpoint and streams both bodies through. It forwards the request's
headers as received (the ``Host`` header too) apart from the hop-by-hop ones, so a client that signs
its requests (SigV4) for the proxy's ``host:port`` is accepted by the upstream server, which checks
the signature against the ``Host`` it receives. With port 0 the system picks a free port; the first
line on stdout is always ``listening on http://HOST:PORT``.

A test or benchmark steers it over HTTP on the same port, under ``/__fault/`` (no S3 bucket name can
contain ``_``, so no S3 request reaches that path). Every control request answers with the state as
JSON; the modes apply to S3 requests that arrive from then on:

==========================  ==========================================================================
``POST /__fault/blackhole``  accept each request and never answer it (the client's timeout ends it)
``POST /__fault/refuse``     close each connection as soon as a request arrives on it, answering nothing
``POST /__fault/error?status=503``  answer every request with that status and an S3 error body
``POST /__fault/throttle?bytes_per_s=N``  forward normally, each direction's bodies held to ``N`` bytes
                             per second over all connections together (a token bucket); 0 lifts it
``POST /__fault/heal``       forward normally, no limit (a blackholed request stays unanswered)
``GET /__fault/state``       the state only
==========================  ==========================================================================

The state: ``mode``, ``bytes_per_s`` (0: no limit), ``requests`` (S3 requests received),
``bytes_up`` / ``bytes_down`` (request / response body bytes forwarded).

:class:`FaultProxy` starts the process and steers it (blocking calls; from async code use
``asyncio.to_thread``). The process stops on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from aiohttp import ClientError, ClientSession, ClientTimeout, HttpVersion11, TCPConnector, web
from multidict import CIMultiDict

CONTROL_PREFIX = "/__fault/"
MODES = ("forward", "blackhole", "refuse", "error")
CHUNK_BYTES = 64 * 1024
"""Bodies are moved in pieces of at most this size (the throttle's granularity)."""
BURST_S = 0.02
"""The throttle lets a direction run this far ahead of its rate (a token bucket of rate * BURST_S)."""
UPSTREAM_TIMEOUT_S = 300.0
"""A forwarded request's limit (the upstream's own slowness; faults are the proxy's)."""
START_TIMEOUT_S = 30.0
CONTROL_TIMEOUT_S = 10.0
HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        "Connection",
        "Keep-Alive",
        "Proxy-Authenticate",
        "Proxy-Authorization",
        "TE",
        "Trailer",
        "Transfer-Encoding",
        "Upgrade",
        "Expect",
    )
)
"""Headers of one connection, not of the request (``Expect: 100-continue`` is answered here; it is
never part of a SigV4 signature)."""


class TokenBucket:
    """Holds a flow of bytes to ``rate_bytes_per_s`` on average, bursts of at most ``BURST_S`` of it.

    Invariant: over any interval of T seconds at most ``rate * (T + BURST_S)`` bytes pass
    :meth:`take`, plus one chunk. Rate 0 means no limit."""

    def __init__(self) -> None:
        self.rate_bytes_per_s = 0
        self._free_at_s = 0.0

    def set_rate(self, rate_bytes_per_s: int) -> None:
        self.rate_bytes_per_s = rate_bytes_per_s
        self._free_at_s = time.monotonic()

    def delay_s(self, size_bytes: int, now_s: float) -> float:
        """Book ``size_bytes`` at ``now_s``; how long the caller must wait before sending them."""
        if self.rate_bytes_per_s <= 0:
            return 0.0
        start_s = max(self._free_at_s, now_s - BURST_S)
        self._free_at_s = start_s + size_bytes / self.rate_bytes_per_s
        return max(0.0, self._free_at_s - BURST_S - now_s)

    async def take(self, size_bytes: int) -> None:
        delay_s = self.delay_s(size_bytes, time.monotonic())
        if delay_s > 0:
            await asyncio.sleep(delay_s)


@dataclass
class ProxyState:
    """What the proxy does to S3 requests now, and what it has forwarded."""

    mode: str = "forward"
    error_status: int = 503
    up: TokenBucket = field(default_factory=TokenBucket)
    down: TokenBucket = field(default_factory=TokenBucket)
    requests: int = 0
    bytes_up: int = 0
    bytes_down: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "error_status": self.error_status,
            "bytes_per_s": self.up.rate_bytes_per_s,
            "requests": self.requests,
            "bytes_up": self.bytes_up,
            "bytes_down": self.bytes_down,
        }


def _error_body(status: int) -> bytes:
    code = "ServiceUnavailable" if status == 503 else "InternalError"
    return (
        f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
        f"<Message>injected by the fault proxy</Message></Error>"
    ).encode()


async def _continue(request: web.BaseRequest) -> None:
    """Answer ``Expect: 100-continue`` (the client then sends its body), as an HTTP/1.1 server does."""
    if request.version == HttpVersion11 and request.headers.get("Expect", "").lower() == "100-continue":
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0


class Proxy:
    """The proxy's request handling (one instance per process)."""

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"--upstream must be http://HOST:PORT, got {upstream!r}")
        self.upstream = f"http://{parts.hostname}:{parts.port or 80}"
        self.state = ProxyState()
        self._session: ClientSession | None = None

    async def start(self) -> None:
        self._session = ClientSession(
            connector=TCPConnector(limit=256),
            timeout=ClientTimeout(total=UPSTREAM_TIMEOUT_S),
            auto_decompress=False,
            skip_auto_headers=("Accept", "Accept-Encoding", "User-Agent", "Content-Type"),
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        if request.path.startswith(CONTROL_PREFIX):
            return self._control(request)
        self.state.requests += 1
        mode = self.state.mode
        if mode == "blackhole":
            return await self._blackhole(request)
        if mode == "refuse":
            if request.transport is not None:
                request.transport.abort()
            raise asyncio.CancelledError  # nothing can be written on an aborted connection
        try:
            await _continue(request)
            if mode == "error":
                await self._drain(request)
                return web.Response(
                    status=self.state.error_status,
                    body=_error_body(self.state.error_status),
                    content_type="application/xml",
                )
            return await self._forward(request)
        except ConnectionResetError as exc:  # the client hung up (its timeout): no one to answer
            raise asyncio.CancelledError from exc
        except ClientError as exc:  # the upstream failed: the client sees a gateway error
            return web.Response(status=502, text=f"upstream: {type(exc).__name__}: {exc}")

    def _control(self, request: web.BaseRequest) -> web.Response:
        action = request.path[len(CONTROL_PREFIX) :]
        state = self.state
        if request.method == "POST":
            try:
                if action == "blackhole":
                    state.mode = "blackhole"
                elif action == "refuse":
                    state.mode = "refuse"
                elif action == "error":
                    state.error_status = int(request.query.get("status", "503"))
                    state.mode = "error"
                elif action == "throttle":
                    rate = int(request.query["bytes_per_s"])
                    if rate < 0:
                        raise ValueError("bytes_per_s must be >= 0")
                    state.up.set_rate(rate)
                    state.down.set_rate(rate)
                    state.mode = "forward"
                elif action == "heal":
                    state.up.set_rate(0)
                    state.down.set_rate(0)
                    state.mode = "forward"
                else:
                    return web.json_response({"error": f"unknown action {action!r}"}, status=404)
            except (KeyError, ValueError) as exc:
                return web.json_response({"error": f"bad {action} request: {exc}"}, status=400)
        elif action != "state":
            return web.json_response({"error": f"unknown action {action!r}"}, status=404)
        return web.json_response(state.to_json())

    async def _blackhole(self, request: web.BaseRequest) -> web.StreamResponse:
        """Never answers: the handler is cancelled when the client hangs up (``handler_cancellation``)."""
        del request
        await asyncio.get_running_loop().create_future()
        raise AssertionError("unreachable: nothing completes the future")

    async def _drain(self, request: web.BaseRequest) -> None:
        while await request.content.read(CHUNK_BYTES):
            pass

    async def _body(self, request: web.BaseRequest) -> AsyncIterator[bytes]:
        while chunk := await request.content.read(CHUNK_BYTES):
            await self.state.up.take(len(chunk))
            self.state.bytes_up += len(chunk)
            yield chunk

    async def _forward(self, request: web.BaseRequest) -> web.StreamResponse:
        assert self._session is not None, "start() first"
        headers = CIMultiDict((k, v) for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP)
        has_body = request.body_exists
        async with self._session.request(
            request.method,
            self.upstream + request.rel_url.raw_path_qs,
            headers=headers,
            data=self._body(request) if has_body else None,
            allow_redirects=False,
            skip_auto_headers=("Accept", "Accept-Encoding", "User-Agent", "Content-Type"),
        ) as upstream:
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for key, value in upstream.headers.items():
                if key.lower() not in HOP_BY_HOP:
                    response.headers.add(key, value)
            await response.prepare(request)
            try:
                while chunk := await upstream.content.read(CHUNK_BYTES):
                    await self.state.down.take(len(chunk))
                    self.state.bytes_down += len(chunk)
                    await response.write(chunk)
            except ClientError as exc:  # the upstream broke off mid-body: so does the proxy
                if request.transport is not None:
                    request.transport.abort()
                raise asyncio.CancelledError from exc
            await response.write_eof()
            return response


async def serve(listen: str, upstream: str, *, ready: asyncio.Event | None = None) -> None:
    """Run the proxy until SIGTERM / SIGINT (or cancellation)."""
    host, _, port = listen.rpartition(":")
    proxy = Proxy(upstream)
    await proxy.start()
    server = web.Server(proxy.handle, handler_cancellation=True, access_log=None)
    runner = web.ServerRunner(server, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host or "127.0.0.1", int(port), backlog=512)
    await site.start()
    sockets = server_sockets(runner)
    bound_host, bound_port = sockets[0][:2]
    print(f"listening on http://{bound_host}:{bound_port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if ready is not None:
        ready.set()
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
        await proxy.close()


def server_sockets(runner: web.ServerRunner) -> list[tuple[Any, ...]]:
    return [
        sock.getsockname() for site in runner.sites for sock in (getattr(site._server, "sockets", None) or [])
    ]


class FaultProxy:
    """A fault proxy process in front of ``upstream``, and its control calls (blocking)."""

    def __init__(self, process: subprocess.Popen[str], endpoint: str) -> None:
        self.process = process
        self.endpoint = endpoint
        """``http://127.0.0.1:PORT``: what clients use instead of the upstream endpoint."""

    @classmethod
    def start(cls, upstream: str, *, listen: str = "127.0.0.1:0") -> FaultProxy:
        """Start the process and wait for its ``listening on`` line (RuntimeError if it does not come)."""
        process = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.fault_proxy", "--listen", listen, "--upstream", upstream],
            stdout=subprocess.PIPE,
            text=True,
            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        )
        assert process.stdout is not None
        deadline_s = time.monotonic() + START_TIMEOUT_S
        line = ""
        while time.monotonic() < deadline_s and process.poll() is None:
            line = process.stdout.readline()
            if line.startswith("listening on "):
                return cls(process, line.split()[-1])
        process.kill()
        process.wait()
        raise RuntimeError(f"the fault proxy did not start (exit {process.returncode}, said {line!r})")

    def _call(self, action: str, method: str = "POST", **query: int) -> dict[str, Any]:
        qs = "&".join(f"{k}={v}" for k, v in query.items())
        url = f"{self.endpoint}{CONTROL_PREFIX}{action}" + (f"?{qs}" if qs else "")
        request = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
        with urllib.request.urlopen(request, timeout=CONTROL_TIMEOUT_S) as response:
            state: dict[str, Any] = json.loads(response.read())
        return state

    def blackhole(self) -> dict[str, Any]:
        return self._call("blackhole")

    def refuse(self) -> dict[str, Any]:
        return self._call("refuse")

    def error(self, status: int = 503) -> dict[str, Any]:
        return self._call("error", status=status)

    def throttle(self, bytes_per_s: int) -> dict[str, Any]:
        return self._call("throttle", bytes_per_s=bytes_per_s)

    def heal(self) -> dict[str, Any]:
        return self._call("heal")

    def state(self) -> dict[str, Any]:
        return self._call("state", method="GET")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s; waits for the exit."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fault_proxy", description=__doc__)
    parser.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT (port 0: any free port)")
    parser.add_argument("--upstream", required=True, help="the S3 endpoint, http://HOST:PORT")
    args = parser.parse_args(argv)
    try:
        asyncio.run(serve(args.listen, args.upstream))
    except ValueError as exc:
        print(f"fault_proxy: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
