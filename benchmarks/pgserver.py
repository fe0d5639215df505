"""The PostgreSQL server a benchmark measures, and a private schema on it per measurement.

:func:`resolve_pg_url` picks the server: ``--metadata-url`` (``Context.metadata_url``), else
``S3STREAM_TEST_PG_URL``, else the project's own server (``scripts/postgres start``, then the URL
``scripts/postgres env`` prints). No server is an error naming the three ways to give one; a run never
falls back to measuring SQLite alone.

:func:`pg_schema` creates a schema no one else uses and yields the server's URL with
``options=-csearch_path=<schema>`` added, so every connection of every process that opens that URL
works in it; the schema is dropped with CASCADE afterwards, also when the measurement failed.
"""

from __future__ import annotations

import os
import subprocess
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
PG_SCRIPT = REPO_ROOT / "scripts" / "postgres"
PG_URL_ENV = "S3STREAM_TEST_PG_URL"
PG_SCRIPT_TIMEOUT_S = 180.0
"""``scripts/postgres start`` installs the package on a fresh machine: minutes, not hours."""
SCHEMA_PREFIX = "bench_"


class NoPostgresError(RuntimeError):
    """No PostgreSQL server to measure: none given and the project's script could not start one."""


def resolve_pg_url(explicit: str | None, log: Callable[[str], None]) -> str:
    """The server's URL: ``explicit``, else ``S3STREAM_TEST_PG_URL``, else ``scripts/postgres``."""
    if explicit:
        if not explicit.startswith(("postgresql://", "postgres://")):
            raise NoPostgresError("--metadata-url must be a postgresql:// URL (SQLite is the baseline)")
        return explicit
    from_env = os.environ.get(PG_URL_ENV)
    if from_env:
        return from_env
    if not PG_SCRIPT.exists():
        raise NoPostgresError(
            f"no PostgreSQL: pass --metadata-url or set {PG_URL_ENV} ({PG_SCRIPT} is missing)"
        )
    log("starting the project's PostgreSQL (scripts/postgres start) ...")
    try:
        started = subprocess.run(
            [str(PG_SCRIPT), "start"],
            capture_output=True,
            text=True,
            check=False,
            timeout=PG_SCRIPT_TIMEOUT_S,
        )
        printed = subprocess.run(
            [str(PG_SCRIPT), "env"], capture_output=True, text=True, check=False, timeout=PG_SCRIPT_TIMEOUT_S
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise NoPostgresError(f"no PostgreSQL: scripts/postgres failed: {exc}") from exc
    if started.returncode != 0:
        raise NoPostgresError(
            f"no PostgreSQL: scripts/postgres start failed (pass --metadata-url or set {PG_URL_ENV}):\n"
            + started.stderr[-2000:]
        )
    for word in printed.stdout.split():
        name, _, value = word.partition("=")
        if name == PG_URL_ENV and value:
            return value.strip("'\"")
    raise NoPostgresError(f"scripts/postgres env printed no {PG_URL_ENV}")


def with_search_path(url: str, schema: str) -> str:
    """``url`` with ``options=-csearch_path=<schema>`` added to its query."""
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qsl(parts.query)
    query.append(("options", f"-csearch_path={schema}"))
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))


def redacted(url: str) -> str:
    """``url`` without its password (for notes and errors)."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc, query=""))


@asynccontextmanager
async def pg_schema(base_url: str, name: str) -> AsyncIterator[str]:
    """A fresh schema ``bench_<name>_<random>`` on ``base_url``: yields the URL that uses it, drops it after."""
    import psycopg

    schema = f"{SCHEMA_PREFIX}{name}_{uuid.uuid4().hex[:10]}"
    try:
        async with await psycopg.AsyncConnection.connect(base_url, autocommit=True) as conn:
            await conn.execute(f'CREATE SCHEMA "{schema}"')
    except psycopg.Error as exc:
        raise NoPostgresError(f"cannot create a schema on {redacted(base_url)}: {exc}") from exc
    try:
        yield with_search_path(base_url, schema)
    finally:
        async with await psycopg.AsyncConnection.connect(base_url, autocommit=True) as conn:
            await conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
