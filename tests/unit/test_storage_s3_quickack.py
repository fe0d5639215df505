"""Quick ACKs on the S3 client's connections (s3stream.storage.s3quickack), against a real local
HTTP server that, like Ceph RGW, leaves Nagle's algorithm on and writes headers and body apart."""

from __future__ import annotations

import asyncio
import functools
import socket
import statistics
import threading
import time
from collections.abc import Iterator

import aiohttp
import pytest
from aiohttp.client_proto import ResponseHandler

from s3stream.storage.s3quickack import TCP_QUICKACK, QuickAckResponseHandler, use_quick_acks

pytestmark = pytest.mark.skipif(TCP_QUICKACK is None, reason="TCP_QUICKACK is Linux-only")

BODY = b"x" * 200
REQUESTS = 12


def _serve(listener: socket.socket) -> None:
    """Answer every request on each accepted connection with headers and body in two writes."""
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return  # the listener was closed
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 0)  # Nagle on, as the RGW's frontend
            pending = b""
            while data := conn.recv(65536):
                pending += data
                while b"\r\n\r\n" in pending:
                    _, _, pending = pending.partition(b"\r\n\r\n")
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BODY))
                    conn.sendall(BODY)  # a second small segment: held until the headers are ACKed


@pytest.fixture
def nagle_server() -> Iterator[str]:
    listener = socket.create_server(("127.0.0.1", 0))
    thread = threading.Thread(target=_serve, args=(listener,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/"
    finally:
        listener.shutdown(socket.SHUT_RDWR)  # wakes the thread's accept()
        listener.close()
        thread.join(timeout=5)
        assert not thread.is_alive()


async def _median_request_s(url: str, *, quick_acks: bool) -> float:
    connector = aiohttp.TCPConnector(limit=1)
    if quick_acks:
        assert use_quick_acks(connector)
    times: list[float] = []
    async with aiohttp.ClientSession(connector=connector) as session:
        for _ in range(REQUESTS):  # one keep-alive connection: the kernel delays ACKs after the first
            started = time.perf_counter()
            async with session.get(url) as response:
                assert await response.read() == BODY
            times.append(time.perf_counter() - started)
    return statistics.median(times)


async def test_quick_acks_remove_the_delayed_ack_stall(nagle_server: str) -> None:
    plain_s = await _median_request_s(nagle_server, quick_acks=False)
    quick_s = await _median_request_s(nagle_server, quick_acks=True)
    assert plain_s > 0.030, f"the server should show the stall without quick ACKs: {plain_s * 1000:.1f} ms"
    assert quick_s < 0.015, f"with quick ACKs a small response took {quick_s * 1000:.1f} ms"


async def test_use_quick_acks_swaps_the_protocol_factory_only_when_it_knows_it() -> None:
    connector = aiohttp.TCPConnector()
    try:
        assert use_quick_acks(connector)
        factory = connector._factory
        assert isinstance(factory, functools.partial)
        assert factory.func is QuickAckResponseHandler
        assert factory.keywords["loop"] is asyncio.get_running_loop()
        assert not use_quick_acks(connector)  # already swapped: not a partial of ResponseHandler
    finally:
        await connector.close()


def test_a_non_tcp_transport_is_left_alone() -> None:
    loop = asyncio.new_event_loop()
    left, right = socket.socketpair()
    try:

        class Transport(asyncio.Transport):
            def get_extra_info(self, name: str, default: object = None) -> object:
                return left if name == "socket" else default

        handler = QuickAckResponseHandler(loop=loop)
        handler.connection_made(Transport())
        assert handler._quickack_socket is None
        plain = ResponseHandler(loop=loop)
        assert not isinstance(plain, QuickAckResponseHandler)
    finally:
        left.close()
        right.close()
        loop.close()
