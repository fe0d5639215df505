"""Fault injection for object storage: a wrapper for any ObjectStorage, and a flaky HTTP proxy for S3.

:class:`FaultyObjectStorage` wraps a backend and, following a seeded :class:`FaultPlan`, makes chosen
operations fail (``error``), time out (``timeout``: a wait, then UnavailableError), run slowly
(``slow``) or lose their reply (``lost_reply``: the operation takes effect, then the caller sees an
error, as when a connection drops after the server committed). Failed upload steps abort the inner
upload first, like the real backends. Engine tests reuse it to check recovery paths.

:class:`FlakyS3Proxy` sits between the S3 client and a real server (Ceph RGW) and, per request,
answers 5xx/429/403 itself, resets the connection before or after forwarding, cuts a response body
short, delays, or fails every key of a DeleteObjects: the S3 backend's retry loop meets real
transport failures, not mocks.
"""

from __future__ import annotations

import asyncio
import random
import re
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

from s3stream.errors import UnavailableError
from s3stream.storage.base import ObjectInfo, ObjectStorage, Upload

FaultKind = Literal["error", "timeout", "slow", "lost_reply"]
OPS = (
    "put",
    "get",
    "head",
    "delete",
    "list",
    "upload.write",
    "upload.copy",
    "upload.complete",
    "upload.abort",
)


def _unavailable(what: str) -> Exception:
    return UnavailableError(f"injected fault: {what}")


@dataclass
class Fault:
    """One rule: ``op`` is one of OPS or ``*``; it fires on matching calls with ``probability``.

    ``skip_calls`` matching calls pass untouched first; then at most ``times`` calls fire (None: no
    limit). ``key_prefix`` narrows the rule to keys starting with it.
    """

    op: str
    kind: FaultKind = "error"
    probability: float = 1.0
    times: int | None = None
    skip_calls: int = 0
    delay_s: float = 0.0
    key_prefix: str = ""
    make_error: Callable[[str], Exception] = _unavailable
    seen: int = 0
    fired: int = 0

    def __post_init__(self) -> None:
        assert self.op == "*" or self.op in OPS, self.op
        assert 0.0 <= self.probability <= 1.0


@dataclass
class FaultPlan:
    faults: list[Fault]
    seed: int = 0
    enabled: bool = True
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def pick(self, op: str, key: str) -> Fault | None:
        if not self.enabled:
            return None
        for fault in self.faults:
            if (fault.op not in ("*", op)) or not key.startswith(fault.key_prefix):
                continue
            fault.seen += 1
            if fault.seen <= fault.skip_calls or (fault.times is not None and fault.fired >= fault.times):
                continue
            if self.rng.random() < fault.probability:
                fault.fired += 1
                return fault
        return None


class FaultyObjectStorage:
    """An ObjectStorage that injects the faults of ``plan`` in front of ``inner``."""

    def __init__(self, inner: ObjectStorage, plan: FaultPlan) -> None:
        self.inner = inner
        self.plan = plan
        self.calls: Counter[str] = Counter()
        self.injected: Counter[str] = Counter()

    async def run(self, op: str, key: str, action: Callable[[], Awaitable[Any]]) -> Any:
        """Run ``action`` (a coroutine factory) under whatever fault the plan picks."""
        self.calls[op] += 1
        fault = self.plan.pick(op, key)
        what = f"{op} {key!r}"
        if fault is None:
            return await action()
        self.injected[f"{op}:{fault.kind}"] += 1
        if fault.kind == "error":
            raise fault.make_error(what)
        if fault.kind == "timeout":
            await asyncio.sleep(fault.delay_s)
            raise UnavailableError(f"injected fault: {what} timed out after {fault.delay_s}s")
        if fault.kind == "slow":
            await asyncio.sleep(fault.delay_s)
            return await action()
        await action()
        raise fault.make_error(f"{what} (reply lost after it took effect)")

    async def put(self, key: str, data: bytes | bytearray | memoryview, *, if_absent: bool = False) -> None:
        await self.run("put", key, lambda: self.inner.put(key, data, if_absent=if_absent))

    def upload(self, key: str, *, buffer_max_bytes: int | None = None) -> Upload:
        return FaultyUpload(self, self.inner.upload(key, buffer_max_bytes=buffer_max_bytes))

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        data = await self.run("get", key, lambda: self.inner.get(key, start, end))
        assert isinstance(data, bytes)
        return data

    async def head(self, key: str) -> ObjectInfo:
        info = await self.run("head", key, lambda: self.inner.head(key))
        assert isinstance(info, ObjectInfo)
        return info

    async def delete(self, keys: Sequence[str]) -> None:
        await self.run("delete", keys[0] if keys else "", lambda: self.inner.delete(keys))

    async def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        async def collect() -> list[ObjectInfo]:
            return [info async for info in self.inner.list(prefix)]

        found = await self.run("list", prefix, collect)
        assert isinstance(found, list)
        for info in found:
            yield info

    async def close(self) -> None:
        await self.inner.close()


class FaultyUpload:
    """An Upload whose steps go through the plan; a failed step aborts the inner upload."""

    def __init__(self, owner: FaultyObjectStorage, inner: Upload) -> None:
        self.key = inner.key
        self._owner = owner
        self._inner = inner

    async def _step(self, op: str, action: Callable[[], Awaitable[Any]]) -> Any:
        try:
            return await self._owner.run(op, self.key, action)
        except BaseException:
            await self._inner.abort()  # a no-op after a complete whose reply was lost
            raise

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        await self._step("upload.write", lambda: self._inner.write(data))

    async def copy(self, source_key: str, start: int, end: int) -> None:
        await self._step("upload.copy", lambda: self._inner.copy(source_key, start, end))

    async def complete(self) -> int:
        size = await self._step("upload.complete", self._inner.complete)
        assert isinstance(size, int)
        return size

    async def abort(self) -> None:
        await self._owner.run("upload.abort", self.key, self._inner.abort)


# -- a flaky HTTP proxy in front of a real S3 server ---------------------------------------------

ProxyAction = Literal[
    "503", "500", "slowdown", "429", "403", "reset", "lost_reply", "cut_body", "delay", "delete_keys_fail"
]
_STATUS_REPLIES = {
    "503": (503, "Service Unavailable", "ServiceUnavailable"),
    "500": (500, "Internal Server Error", "InternalError"),
    "slowdown": (503, "Slow Down", "SlowDown"),
    "429": (429, "Too Many Requests", "TooManyRequests"),
    "403": (403, "Forbidden", "AccessDenied"),
}


@dataclass
class ProxyRule:
    """Fire ``action`` on requests whose method is ``method`` (or any, if None) and whose target
    (path + query) matches the regex ``target``, after ``skip`` matches, at most ``times`` times."""

    action: ProxyAction
    method: str | None = None
    target: str = ""
    times: int | None = 1
    skip: int = 0
    delay_s: float = 0.0
    header: str = ""
    """Only requests carrying this header (case-insensitive name) match."""
    seen: int = 0
    fired: int = 0

    def matches(self, method: str, target: str, headers: dict[str, str]) -> bool:
        if self.method is not None and method != self.method:
            return False
        if self.target and not re.search(self.target, target):
            return False
        if self.header and self.header.lower() not in headers:
            return False
        self.seen += 1
        if self.seen <= self.skip or (self.times is not None and self.fired >= self.times):
            return False
        self.fired += 1
        return True


class FlakyS3Proxy:
    """An HTTP/1.1 proxy on 127.0.0.1 forwarding to ``upstream`` and injecting ``rules``' faults.

    Each forwarded request uses a fresh upstream connection with ``Connection: close``; the
    client's ``Host`` header is kept, so SigV4 signatures stay valid.
    """

    def __init__(self, upstream: str, rules: list[ProxyRule] | None = None) -> None:
        parts = urlsplit(upstream)
        assert parts.scheme == "http", upstream
        assert parts.hostname, upstream
        assert parts.port, upstream
        self.upstream_host = parts.hostname
        self.upstream_port = parts.port
        self.rules = rules or []
        self.requests: list[tuple[str, str]] = []
        self.faults: Counter[str] = Counter()
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._handlers):
                task.cancel()
            await asyncio.gather(*self._handlers, return_exceptions=True)
            await self._server.wait_closed()

    def count(self, method: str, target: str = "") -> int:
        return sum(1 for m, t in self.requests if m == method and re.search(target, t))

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            while not reader.at_eof():
                if not await self._one_request(reader, writer):
                    break
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            self._handlers.discard(task)
            writer.close()

    async def _one_request(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return False
        lines = head.decode("latin-1").split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        if headers.get("expect", "").lower() == "100-continue":
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # we buffer the body before deciding
            await writer.drain()
        body = await self._read_body(reader, headers)
        self.requests.append((method, target))
        rule = next((r for r in self.rules if r.matches(method, target, headers)), None)
        action = rule.action if rule else None
        if action is not None:
            self.faults[action] += 1
        if action in _STATUS_REPLIES:
            status, reason, code = _STATUS_REPLIES[action]
            xml = f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code><Message>injected</Message></Error>"
            writer.write(
                f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/xml\r\nContent-Length: {len(xml)}\r\n"
                f"\r\n{xml}".encode()
            )
            await writer.drain()
            return True
        if action == "delete_keys_fail":
            keys = re.findall(rb"<Key>(.*?)</Key>", body)
            errors = b"".join(
                b"<Error><Key>" + key + b"</Key><Code>InternalError</Code><Message>injected</Message></Error>"
                for key in keys
            )
            result = b"<?xml version='1.0' encoding='UTF-8'?><DeleteResult>" + errors + b"</DeleteResult>"
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/xml\r\nContent-Length: %d\r\n\r\n"
                % len(result)
                + result
            )
            await writer.drain()
            return True
        if action == "reset":
            writer.transport.abort()
            return False
        if action == "delay":
            await asyncio.sleep(rule.delay_s if rule else 0.0)
        response = await self._forward(head, body)
        if action == "lost_reply":
            writer.transport.abort()
            return False
        if action == "cut_body":
            writer.write(response[: max(1, len(response) - 1024)])
            await writer.drain()
            writer.transport.abort()
            return False
        writer.write(response)
        await writer.drain()
        return False  # upstream said Connection: close, and so does the relayed response

    @staticmethod
    async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
        if "chunked" in headers.get("transfer-encoding", "").lower():
            raw = bytearray()
            while True:
                size_line = await reader.readuntil(b"\r\n")
                raw += size_line
                size = int(size_line.split(b";")[0].strip(), 16)
                if size == 0:
                    while True:
                        trailer = await reader.readuntil(b"\r\n")
                        raw += trailer
                        if trailer == b"\r\n":
                            return bytes(raw)
                raw += await reader.readexactly(size + 2)
        length = int(headers.get("content-length", "0") or 0)
        return await reader.readexactly(length) if length else b""

    async def _forward(self, head: bytes, body: bytes) -> bytes:
        lines = head.decode("latin-1").split("\r\n")
        kept = [
            line for line in lines[1:] if line and not line.lower().startswith(("connection:", "expect:"))
        ]
        new_head = "\r\n".join([lines[0], *kept, "Connection: close", "", ""]).encode("latin-1")
        up_reader, up_writer = await asyncio.open_connection(self.upstream_host, self.upstream_port)
        try:
            up_writer.write(new_head + body)
            await up_writer.drain()
            return await up_reader.read()  # until the upstream closes (Connection: close)
        finally:
            up_writer.close()
