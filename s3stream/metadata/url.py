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
from s3stream.logfmt import register_secret
from s3stream.metadata.store import TransactionalStore

SQLITE_SCHEME = "sqlite"
POSTGRES_SCHEMES = ("postgresql", "postgres")
DEFAULT_SQLITE_FILE = "metadata.db"
READ_ONLY_OPTION = "-c default_transaction_read_only=on"
"""The libpq ``options`` a read-only PostgreSQL session runs with: the server refuses every write."""


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
        query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
        if any(_holds_password(name, value) for name, value in query):  # libpq takes ?password= too
            masked = [(name, "***" if _holds_password(name, value) else value) for name, value in query]
            parts = parts._replace(
                query=urllib.parse.urlencode(masked, quote_via=urllib.parse.quote, safe="*")
            )
        if parts.password is None:
            return urllib.parse.urlunsplit(parts)
        user = urllib.parse.quote(parts.username or "", safe="")
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        netloc = f"{user}:***@{host}" + (f":{parts.port}" if parts.port is not None else "")
        return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def _holds_password(name: str, value: str) -> bool:
    return name.lower() == "password" or "password" in value.lower()


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
        if path.startswith("//"):  # sqlite:////abs/path (SQLAlchemy's spelling): one leading slash
            path = "/" + path.lstrip("/")
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
        register_secret(parts.password)  # redacted from every log line (s3stream.logfmt)
        return MetadataURL("postgresql", url)
    raise InvalidArgumentError(
        f"metadata URL scheme {scheme[:40]!r} is not supported: use sqlite:///path or postgresql://..."
    )


def default_metadata_url(data_dir: str | os.PathLike[str]) -> str:
    """``sqlite:///<data_dir>/metadata.db`` (made absolute)."""
    return "sqlite://" + urllib.parse.quote(str(Path(os.path.abspath(data_dir)) / DEFAULT_SQLITE_FILE))


async def open_metadata_store(
    url: str | MetadataURL, *, clock_ms: Clock | None = None, read_only: bool = False
) -> TransactionalStore:
    """Open the store ``url`` names. Writable: created and its schema migrated if needed.
    ``read_only``: nothing can be written through it and opening writes nothing (SQLite through
    :mod:`s3stream.metadata.sqlite_readonly`; PostgreSQL in a session whose transactions the server
    keeps read-only, :func:`read_only_url`). ``clock_ms`` None: the store's own clock (the database
    server's for PostgreSQL, the wall clock for SQLite)."""
    parsed = url if isinstance(url, MetadataURL) else parse_metadata_url(url)
    if parsed.is_sqlite:
        if read_only:
            from s3stream.metadata.sqlite_readonly import ReadOnlySqliteStore

            return await ReadOnlySqliteStore.open(parsed.sqlite_path)
        from s3stream.metadata.sqlite import SqliteMetadataStore

        return await SqliteMetadataStore.open(parsed.sqlite_path, clock_ms=clock_ms or wall_clock_ms)
    from s3stream.metadata.postgres import PostgresMetadataStore

    target = read_only_url(parsed) if read_only else parsed.url
    return await PostgresMetadataStore.open(target, clock_ms=clock_ms)


def read_only_url(url: MetadataURL) -> str:
    """A PostgreSQL URL whose session runs every transaction read-only (its own ``options`` kept)."""
    parts = urllib.parse.urlsplit(url.url)
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    options = [value for name, value in query if name == "options"]
    rest = [(name, value) for name, value in query if name != "options"]
    merged = " ".join([*options, READ_ONLY_OPTION])
    new_query = urllib.parse.urlencode([*rest, ("options", merged)], quote_via=urllib.parse.quote)
    return urllib.parse.urlunsplit(parts._replace(query=new_query))


def _redacted(url: str) -> str:
    try:
        return MetadataURL("postgresql", url).describe()
    except ValueError:
        return "postgresql://…"
