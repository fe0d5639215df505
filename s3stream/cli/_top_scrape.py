"""One scrape of a node's metrics endpoint for ``s3stream top``: fetched, parsed, or the reason it failed.

A scrape is the text exposition format at ``http://host:port/metrics`` parsed with
``prometheus_client``'s own parser into samples keyed by sample name (``s3stream_append_bytes_total``,
``s3stream_append_latency_seconds_bucket``...). A node that does not answer, answers with an HTTP
error or with text that does not parse is a :class:`Scrape` with ``error`` set: ``top`` shows it as
down and keeps going.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

from s3stream.errors import InvalidArgumentError

SCRAPE_BYTES_MAX = 16 * 1024 * 1024
"""A body longer than this is refused (a node's exposition is a few tens of KiB)."""

Labels = Mapping[str, str]


@dataclass(frozen=True)
class Scrape:
    """What one endpoint said at ``at_s`` (monotonic seconds): ``samples`` by sample name, each a list
    of (labels, value); ``error`` is None when the scrape worked, else why it did not (then
    ``samples`` is empty)."""

    url: str
    at_s: float
    samples: dict[str, list[tuple[Labels, float]]] = field(default_factory=dict)
    error: str | None = None

    @property
    def up(self) -> bool:
        return self.error is None

    def total(self, name: str, **labels: str) -> float | None:
        """The sum of the samples ``name`` whose labels include ``labels``; None when there is none."""
        values = [
            v for lbl, v in self.samples.get(name, ()) if all(lbl.get(k) == x for k, x in labels.items())
        ]
        return sum(values) if values else None

    def label_values(self, name: str, label: str) -> list[str]:
        """The values ``label`` takes among the samples ``name``, sorted, once each."""
        return sorted({lbl[label] for lbl, _ in self.samples.get(name, ()) if label in lbl})


def endpoint_url(text: str) -> str:
    """``host:port``, ``http://host:port`` or a full URL, as the URL to scrape (path ``/metrics`` when
    none is given). InvalidArgumentError when it names no host."""
    raw = text.strip()
    if "://" not in raw:
        raw = f"http://{raw}"
    parts = urlsplit(raw)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidArgumentError(
            f"metrics endpoint {text!r}: expected host:port or http://host:port/metrics"
        )
    path = parts.path if parts.path not in ("", "/") else "/metrics"
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def parse_exposition(text: str) -> dict[str, list[tuple[Labels, float]]]:
    """The samples of a text exposition by sample name (ValueError when it does not parse)."""
    from prometheus_client.parser import text_string_to_metric_families  # imported when top runs

    samples: dict[str, list[tuple[Labels, float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    return samples


def scrape(url: str, *, timeout_s: float) -> Scrape:
    """Fetch and parse ``url`` (blocking); never raises for a node that is down or answers badly."""
    at_s = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            body = response.read(SCRAPE_BYTES_MAX + 1)
        if len(body) > SCRAPE_BYTES_MAX:
            return Scrape(url, at_s, error=f"answer longer than {SCRAPE_BYTES_MAX} bytes")
        return Scrape(url, at_s, parse_exposition(body.decode("utf-8", errors="replace")))
    except urllib.error.HTTPError as exc:
        return Scrape(url, at_s, error=f"HTTP {exc.code}")
    except urllib.error.URLError as exc:
        return Scrape(url, at_s, error=_reason(exc.reason))
    except (OSError, ValueError) as exc:  # timeouts, resets, a body that is not an exposition
        return Scrape(url, at_s, error=_reason(exc))


def _reason(reason: object) -> str:
    if isinstance(reason, BaseException):
        text = getattr(reason, "strerror", None) or str(reason) or type(reason).__name__
        return str(text)
    return str(reason)
