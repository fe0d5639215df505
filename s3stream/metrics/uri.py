"""The metrics switch: AutoMQ's ``s3.telemetry.metrics.exporter.uri`` and ``s3.telemetry.metrics.level``.

``prometheus://?host=127.0.0.1&port=9464`` turns the Prometheus exporter on (host default
``127.0.0.1``, port default 9464; port 0 binds any free port). An empty URI leaves metrics off. Any
other scheme, an unknown query key, a port outside 0-65535 or a URI with a path or an authority is
refused with :class:`~s3stream.errors.InvalidArgumentError` naming the key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from urllib.parse import parse_qs, urlsplit

from s3stream.errors import InvalidArgumentError

URI_KEY = "s3.telemetry.metrics.exporter.uri"
LEVEL_KEY = "s3.telemetry.metrics.level"
LEVELS = ("INFO", "DEBUG")
"""INFO: node-wide series only; DEBUG adds per-stream series (label ``stream``)."""
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 9464

MetricsLevel = Literal["INFO", "DEBUG"]


@dataclass(frozen=True, slots=True)
class ExporterAddress:
    """Where the Prometheus exporter listens (``port`` 0: any free port, chosen at bind)."""

    host: str
    port: int


def parse_exporter_uri(uri: str) -> ExporterAddress | None:
    """The exporter's address, or None when ``uri`` is empty (metrics off)."""
    if not isinstance(uri, str):
        raise InvalidArgumentError(f"{URI_KEY} must be a string, got {uri!r}")
    text = uri.strip()
    if not text:
        return None
    try:
        parts = urlsplit(text)
        query = parse_qs(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError as exc:
        raise InvalidArgumentError(f"{URI_KEY} = {uri!r} is not a URI: {exc}") from exc
    if parts.scheme != "prometheus":
        raise InvalidArgumentError(
            f"{URI_KEY} = {uri!r}: only prometheus://?host=H&port=P is supported (scheme {parts.scheme!r})"
        )
    if parts.netloc or parts.path not in ("", "/") or parts.fragment:
        raise InvalidArgumentError(
            f"{URI_KEY} = {uri!r}: give the address as query parameters, prometheus://?host=H&port=P"
        )
    unknown = sorted(set(query) - {"host", "port"})
    if unknown:
        raise InvalidArgumentError(f"{URI_KEY} = {uri!r}: unknown parameter(s) {', '.join(unknown)}")
    for name, values in query.items():
        if len(values) != 1:
            raise InvalidArgumentError(f"{URI_KEY} = {uri!r}: {name} given {len(values)} times")
    host = query.get("host", [DEFAULT_HOST])[0].strip()
    if not host or any(c.isspace() or c in "/?#@" for c in host):
        raise InvalidArgumentError(f"{URI_KEY} = {uri!r}: bad host {host!r}")
    raw_port = query.get("port", [str(DEFAULT_PORT)])[0].strip()
    if not (raw_port.isascii() and raw_port.isdigit()) or len(raw_port) > 5 or int(raw_port) > 65535:
        raise InvalidArgumentError(f"{URI_KEY} = {uri!r}: port must be an integer 0-65535, got {raw_port!r}")
    return ExporterAddress(host=host, port=int(raw_port))


def parse_level(level: str) -> MetricsLevel:
    """``INFO`` or ``DEBUG`` (case-insensitive)."""
    if not isinstance(level, str) or level.strip().upper() not in LEVELS:
        raise InvalidArgumentError(f"{LEVEL_KEY} must be one of {', '.join(LEVELS)}, got {level!r}")
    return "DEBUG" if level.strip().upper() == "DEBUG" else "INFO"
