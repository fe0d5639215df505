"""Fault proxies for tests: one :class:`benchmarks.fault_proxy.FaultProxy` process per bucket.

``fault_proxies`` (a fixture, imported by ``tests/conftest.py``) is a factory: each call starts one
proxy process in front of the S3 test server and returns it; every proxy it started is stopped after
the test. A test that puts each bucket behind its own proxy can fail one bucket (blackhole, refuse,
errors) or throttle it without touching the others. Needs the S3 test server (``s3_server``: fails
without one when ``S3STREAM_REQUIRE_S3=1``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from benchmarks.fault_proxy import FaultProxy
from tests.support.s3 import S3TestServer


def proxied(server: S3TestServer, proxy: FaultProxy) -> S3TestServer:
    """``server`` reached through ``proxy`` (same bucket and keys, the proxy's endpoint)."""
    return S3TestServer(
        endpoint=proxy.endpoint,
        access_key=server.access_key,
        secret_key=server.secret_key,
        bucket=server.bucket,
        region=server.region,
    )


@pytest.fixture
def fault_proxies(s3_server: S3TestServer) -> Iterator[Callable[[], FaultProxy]]:
    """Start fault proxies in front of the S3 test server, one per call; all stopped after the test."""
    started: list[FaultProxy] = []

    def start() -> FaultProxy:
        proxy = FaultProxy.start(s3_server.endpoint)
        started.append(proxy)
        return proxy

    yield start
    for proxy in started:
        proxy.stop()
