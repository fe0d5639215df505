"""Which metadata store a client uses: the ``s3.metadata.url`` key, parsed and opened.

Two schemes:

- ``sqlite:///absolute/path.db`` (three slashes, then an absolute path) or ``sqlite:relative/path.db``:
  the embedded SQLite store (:mod:`s3stream.metadata.sqlite`). The default of a data dir is
  ``sqlite:///<data_dir>/metadata.db``.
- ``postgresql://user:password@host:port/database`` (``postgres://`` too, and libpq query parameters
  such as ``?sslmode=require``): the shared PostgreSQL store (:mod:`s3stream.metadata.postgres`).

:func:`parse_metadata_url` checks a URL without opening anything; :func:`open_metadata_store` opens
the store. :meth:`MetadataURL.describe` is the URL with its password replaced, safe for logs and errors.
"""

from __future__ import annotations

import os
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from s3stream.clock import Clock, wall_clock_ms
from s3stream.errors import InvalidArgumentError
from s3stream.metadata.store import TransactionalStore

SQLITE_SCHEME = "sqlite"
POSTGRES_SCHEMES = ("postgresql", "postgres")
DEFAULT_SQLITE_FILE = "metadata.db"


@dataclass(frozen=True, slots=True)
class MetadataURL:
    """A parsed ``s3.metadata.url``."""

    kind: Literal["sqlite", "postgresql"]
    url: str
    """As given (may hold a password: never log it; use :meth:`describe`)."""
    sqlite_path: str = ""
    """The database file of a ``sqlite`` URL."""

    @property
    def is_sqlite(self) -> bool:
        return self.kind == "sqlite"

    def describe(self) -> str:
        """The URL without its password."""
        if self.is_sqlite:
            return ("sqlite://" if self.sqlite_path.startswith("/") else "sqlite:") + self.sqlite_path
        parts = urllib.parse.urlsplit(self.url)
        if parts.password is None:
            return self.url
        user = urllib.parse.quote(parts.username or "", safe="")
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        netloc = f"{user}:***@{host}" + (f":{parts.port}" if parts.port is not None else "")
        return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def parse_metadata_url(url: str) -> MetadataURL:
    """Check ``url``; raises :class:`~s3stream.errors.InvalidArgumentError` naming what is wrong."""
    if not isinstance(url, str) or not url:
        raise InvalidArgumentError(f"a metadata URL must be a non-empty string, got {url!r}")
    if "\x00" in url:
        raise InvalidArgumentError("a metadata URL must not contain a NUL character")
    scheme, sep, rest = url.partition(":")
    scheme = scheme.lower()
    if not sep:
        raise InvalidArgumentError(
            f"metadata URL {url[:200]!r} has no scheme: use sqlite:///path or postgresql://user@host/db"
        )
    if scheme == SQLITE_SCHEME:
        path = rest[2:] if rest.startswith("//") else rest
        if rest.startswith("//") and not path.startswith("/"):
            raise InvalidArgumentError(
                f"metadata URL {url[:200]!r}: sqlite:// takes an absolute path after a third slash "
                "(sqlite:///var/lib/s3stream/metadata.db) or use sqlite:relative/path.db"
            )
        path = urllib.parse.unquote(path)
        if not path or path == ":memory:" or path.endswith("/"):
            raise InvalidArgumentError(f"metadata URL {url[:200]!r} names no database file")
        return MetadataURL("sqlite", url, sqlite_path=path)
    if scheme in POSTGRES_SCHEMES:
        try:
            parts = urllib.parse.urlsplit(url)
            parts.port  # noqa: B018 - raises ValueError for a bad port
        except ValueError as exc:
            raise InvalidArgumentError(f"metadata URL is not a valid PostgreSQL URL: {exc}") from None
        if not parts.hostname and "host=" not in parts.query:
            raise InvalidArgumentError(f"metadata URL {_redacted(url)!r} names no host")
        if not parts.path.strip("/"):
            raise InvalidArgumentError(f"metadata URL {_redacted(url)!r} names no database (…/dbname)")
        return MetadataURL("postgresql", url)
    raise InvalidArgumentError(
        f"metadata URL scheme {scheme[:40]!r} is not supported: use sqlite:///path or postgresql://..."
    )


def default_metadata_url(data_dir: str | os.PathLike[str]) -> str:
    """``sqlite:///<data_dir>/metadata.db`` (made absolute)."""
    return "sqlite://" + urllib.parse.quote(str(Path(os.path.abspath(data_dir)) / DEFAULT_SQLITE_FILE))


async def open_metadata_store(url: str | MetadataURL, *, clock_ms: Clock | None = None) -> TransactionalStore:
    """Open (creating and migrating the schema if needed) the store ``url`` names.

    ``clock_ms`` None: SQLite uses this machine's wall clock, PostgreSQL the database server's.
    """
    parsed = url if isinstance(url, MetadataURL) else parse_metadata_url(url)
    if parsed.is_sqlite:
        from s3stream.metadata.sqlite import SqliteMetadataStore

        return await SqliteMetadataStore.open(parsed.sqlite_path, clock_ms=clock_ms or wall_clock_ms)
    from s3stream.metadata.postgres import PostgresMetadataStore

    store: TransactionalStore = await PostgresMetadataStore.open(parsed.url, clock_ms=clock_ms)
    return store


def _redacted(url: str) -> str:
    try:
        return MetadataURL("postgresql", url).describe()
    except ValueError:
        return "postgresql://…"
