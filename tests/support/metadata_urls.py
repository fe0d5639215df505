"""Metadata URLs for tests that open stores by URL: a SQLite file or a fresh PostgreSQL schema.

:func:`metadata_url` yields a URL naming an empty store of the requested kind and removes it after:
``sqlite`` is a file under the given directory; ``postgresql`` is a fresh schema on the test server
(:func:`tests.support.postgres.fresh_schema`), dropped afterwards. Without ``S3STREAM_TEST_PG_URL``
the PostgreSQL kind FAILS the test, never skips it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal, cast

from s3stream.metadata.base import MetadataStore
from s3stream.metadata.url import open_metadata_store
from tests.support.postgres import fresh_schema

MetadataKind = Literal["sqlite", "postgresql"]
METADATA_KINDS: tuple[MetadataKind, ...] = ("sqlite", "postgresql")


@contextmanager
def metadata_url(kind: MetadataKind, tmp_dir: Path) -> Iterator[str]:
    """A URL naming an empty metadata store of ``kind`` (removed after)."""
    if kind == "sqlite":
        yield f"sqlite://{tmp_dir.resolve() / f'metadata-{uuid.uuid4().hex[:8]}.db'}"
        return
    with fresh_schema() as url:
        yield url


async def open_store(url: str) -> MetadataStore:
    """The store ``url`` names, typed as the protocol (it has ``close``)."""
    return cast(MetadataStore, await open_metadata_store(url))
