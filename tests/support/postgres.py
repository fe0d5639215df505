"""The PostgreSQL test server: a fresh, empty schema per test on ``S3STREAM_TEST_PG_URL``.

``scripts/postgres start`` runs the project's server; ``eval "$(scripts/postgres env)"`` sets the
variable (``scripts/test`` does both). A test that needs PostgreSQL fails, never skips, when the
variable is unset. The ``pg_url`` fixture (registered in ``tests/conftest.py``) is a URL whose
``search_path`` is a schema made for the test and dropped after it; hand it to subprocesses as is.
"""

from __future__ import annotations

import os
import urllib.parse
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest

PG_URL_ENV = "S3STREAM_TEST_PG_URL"


def pg_server_url() -> str:
    """The test server's URL; fails the test (never skips) when it is not configured."""
    url = os.environ.get(PG_URL_ENV, "")
    if not url:
        pytest.fail(
            f'{PG_URL_ENV} is not set: run scripts/postgres start and eval "$(scripts/postgres env)" '
            "(scripts/test does both), or point it at another PostgreSQL server"
        )
    return url


def with_search_path(url: str, schema: str) -> str:
    """``url`` with ``options=-csearch_path=<schema>`` (replacing any ``options`` it has)."""
    parts = urllib.parse.urlsplit(url)
    query = [(k, v) for k, v in urllib.parse.parse_qsl(parts.query) if k != "options"]
    query.append(("options", f"-csearch_path={schema}"))
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))


@contextmanager
def fresh_schema(server_url: str | None = None) -> Iterator[str]:
    """A URL on a new empty schema (dropped with everything in it on exit)."""
    server_url = server_url or pg_server_url()
    schema = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(server_url, autocommit=True, connect_timeout=10) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        yield with_search_path(server_url, schema)
    finally:
        with psycopg.connect(server_url, autocommit=True, connect_timeout=10) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A PostgreSQL URL on a fresh empty schema of the test server, dropped after the test."""
    with fresh_schema() as url:
        yield url
