"""Metadata URLs for tests that open stores by URL: a SQLite file or a fresh PostgreSQL schema.

:func:`metadata_url` yields a URL naming an empty store of the requested kind and removes it after:
``sqlite`` is a file under the given directory; ``postgresql`` is a fresh schema on the server of
``S3STREAM_TEST_PG_URL`` (the URL carries ``options=-csearch_path=<schema>``), dropped with CASCADE
afterwards. Without ``S3STREAM_TEST_PG_URL`` the PostgreSQL kind FAILS the test, never skips it.
"""

from __future__ import annotations

import os
import urllib.parse
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal, cast

import pytest

from s3stream.metadata.base import MetadataStore
from s3stream.metadata.url import open_metadata_store

PG_URL_ENV = "S3STREAM_TEST_PG_URL"
MetadataKind = Literal["sqlite", "postgresql"]
METADATA_KINDS: tuple[MetadataKind, ...] = ("sqlite", "postgresql")


def pg_base_url() -> str:
    """The test server's URL; fails the running test when it is not set."""
    url = os.environ.get(PG_URL_ENV)
    if not url:
        pytest.fail(
            f"{PG_URL_ENV} is not set: this test needs PostgreSQL (run scripts/postgres start and "
            "eval $(scripts/postgres env))"
        )
    return url


def with_search_path(url: str, schema: str) -> str:
    """``url`` with ``options=-csearch_path=<schema>`` added to its query."""
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qsl(parts.query)
    query.append(("options", f"-csearch_path={schema}"))
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))


@contextmanager
def pg_schema(base_url: str) -> Iterator[str]:
    """A fresh schema on ``base_url``'s database: yields the URL that uses it; drops it after."""
    import psycopg

    schema = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(base_url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield with_search_path(base_url, schema)
    finally:
        with psycopg.connect(base_url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


@contextmanager
def metadata_url(kind: MetadataKind, tmp_dir: Path) -> Iterator[str]:
    """A URL naming an empty metadata store of ``kind`` (removed after)."""
    if kind == "sqlite":
        yield f"sqlite://{tmp_dir.resolve() / f'metadata-{uuid.uuid4().hex[:8]}.db'}"
        return
    with pg_schema(pg_base_url()) as url:
        yield url


async def open_store(url: str) -> MetadataStore:
    """The store ``url`` names, typed as the protocol (it has ``close``)."""
    return cast(MetadataStore, await open_metadata_store(url))
