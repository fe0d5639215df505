"""Quick ACKs on the S3 client's connections: no 40 ms delayed-ACK stall on small responses.

A server that leaves Nagle's algorithm on (Ceph RGW's beast frontend does) writes a response's
headers and its body separately: the body waits until the client ACKs the header segment, and
Linux delays that ACK (up to ~40 ms) in the hope of piggybacking it on data the client would send.
A client waiting for the rest of the response sends nothing, so every response whose body follows
its headers in a second small segment took ~45 ms on the shared Ceph RGW: a GET of 8 KiB (an
object's index) 48 ms against 2-3 ms with quick ACKs, an XML answer (CreateMultipartUpload,
CompleteMultipartUpload, ListObjectsV2) likewise.

``TCP_QUICKACK`` turns delayed ACKs off, but Linux turns them back on by itself (it is not a
persistent option, and a client that sends a request right after a response is "interactive"), so
:class:`QuickAckResponseHandler` sets it again when the first bytes of each response arrive (its
headers): setting it also sends the ACK the kernel was holding, and the body follows at once. A
bulk body's own segments are ACKed as usual (arming on every chunk doubled the ACKs of a 4 MiB GET
and cost CPU on both sides). Nothing else changes: the bytes, the requests and the connection
pool are aiohttp's.

Only where the option exists (Linux) and only on TCP sockets; elsewhere, and on any aiohttp whose
connector does not build its protocols the way this module expects (``_factory``, a partial of
``ResponseHandler``), the session is aiobotocore's own.
"""

from __future__ import annotations

import asyncio
import functools
import socket
from typing import Any

from aiobotocore.httpsession import AIOHTTPSession
from aiohttp.client_proto import ResponseHandler

TCP_QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)
"""The option's number where the platform has it (Linux), else None (the module does nothing)."""


class QuickAckResponseHandler(ResponseHandler):
    """aiohttp's response protocol, re-arming ``TCP_QUICKACK`` as each response's first bytes arrive."""

    _quickack_socket: Any = None
    """The connection's socket while quick ACKs are armed; None: not a TCP socket, or setting the
    option failed once (then it is not tried again on this connection)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        if TCP_QUICKACK is not None and sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            self._quickack_socket = sock
            self._arm()

    def data_received(self, data: bytes) -> None:
        if data and self._quickack_socket is not None:
            payload = getattr(self, "_payload", None)  # aiohttp's body being received, if any
            if payload is None or payload.is_eof():  # the first bytes of a response: its headers
                self._arm()
        super().data_received(data)

    def _arm(self) -> None:
        assert TCP_QUICKACK is not None
        try:
            self._quickack_socket.setsockopt(socket.IPPROTO_TCP, TCP_QUICKACK, 1)
        except OSError:  # a socket being torn down, or one the kernel refuses it for
            self._quickack_socket = None


def use_quick_acks(connector: Any) -> bool:
    """Make ``connector`` (an aiohttp ``TCPConnector``) build :class:`QuickAckResponseHandler`
    protocols for its new connections. False (connector unchanged) where that cannot be done."""
    factory = getattr(connector, "_factory", None)
    if (
        TCP_QUICKACK is None
        or not isinstance(factory, functools.partial)
        or factory.func is not ResponseHandler
    ):
        return False
    connector._factory = functools.partial(QuickAckResponseHandler, *factory.args, **factory.keywords)
    return True


class QuickAckSession(AIOHTTPSession):  # type: ignore[misc]
    """aiobotocore's aiohttp session whose connectors use :func:`use_quick_acks` (the client's
    ``http_session_cls``)."""

    async def _create_connector(self, proxy_url: Any) -> Any:
        connector = await super()._create_connector(proxy_url)
        use_quick_acks(connector)
        return connector
