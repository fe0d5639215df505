"""Bad input gets a clear, typed error and loses nothing: the public surface under hostile input.

Each test is a finding of the errors audit (docs/architecture.md, "Errors"): before its fix the call
raised a bare Python or sqlite3 exception, answered with the wrong error kind, hung, or acted on a
mistyped path. Corrupt objects, WAL damage and bad arguments that already failed cleanly are covered
by their modules' own tests.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from s3stream.config import Config
from s3stream.errors import (
    CorruptionError,
)
from s3stream.metadata.sqlite import SqliteMetadataStore

MiB = 1 << 20
CONFIG = Config(
    wal_capacity_bytes=8 * MiB,
    wal_record_size_max_bytes=1 * MiB,
    record_size_max_bytes=512 * 1024,
    wal_cache_size_bytes=4 * MiB,
    wal_upload_threshold_bytes=1 * MiB,
    close_timeout_ms=200,
)


# -- the SQLite metadata file -------------------------------------------------------------------------


async def _metadata_file(path: Path) -> None:
    store = await SqliteMetadataStore.open(path)
    await store.register_node(node_id=0, node_epoch=1)
    await store.create_stream(node_id=0, node_epoch=1, tags={"a": "b"})
    await store.close()


def _raw_sql(path: Path, *statements: str) -> None:
    conn = sqlite3.connect(path)
    try:
        for statement in statements:
            conn.execute(statement)
        conn.commit()
    finally:
        conn.close()


async def test_metadata_text_that_is_not_utf8_is_corruption(tmp_path: Path) -> None:
    """Before: sqlite3's OperationalError for it became UnavailableError (retriable)."""
    path = tmp_path / "metadata.db"
    await _metadata_file(path)
    _raw_sql(path, "UPDATE streams SET tags = CAST(X'7b2261223aff7d' AS TEXT)")
    store = await SqliteMetadataStore.open(path)
    try:
        with pytest.raises(CorruptionError, match="not UTF-8") as info:
            await store.list_streams()
        assert info.value.source == str(path)
    finally:
        await store.close()


async def test_a_damaged_column_name_in_the_metadata_schema_is_corruption_at_open(tmp_path: Path) -> None:
    """quick_check does not read the schema text; before, the file opened and every statement naming
    the column failed later with "no such column" as UnavailableError."""
    path = tmp_path / "metadata.db"
    await _metadata_file(path)
    _raw_sql(
        path,
        "PRAGMA writable_schema = ON",
        "UPDATE sqlite_master SET sql = replace(sql, 'committed_at_ms', 'committed_at_mz') WHERE name = 'objects'",
    )
    with pytest.raises(CorruptionError, match="differs in: table objects"):
        await SqliteMetadataStore.open(path)


async def test_schema_text_that_is_not_utf8_is_corruption_at_open(tmp_path: Path) -> None:
    path = tmp_path / "metadata.db"
    await _metadata_file(path)
    _raw_sql(
        path,
        "PRAGMA writable_schema = ON",
        "UPDATE sqlite_master SET sql = replace(sql, 'committed_at_ms', CAST(X'636fff' AS TEXT)) "
        "WHERE name = 'objects'",
    )
    with pytest.raises(CorruptionError, match="not UTF-8"):
        await SqliteMetadataStore.open(path)


async def test_a_non_utf8_byte_in_an_index_name_is_corruption_at_open(tmp_path: Path) -> None:
    """A flipped high bit in the schema page: quick_check's report quotes the damaged name, which is
    not UTF-8 (before: a bare UnicodeDecodeError from the open)."""
    path = tmp_path / "metadata.db"
    await _metadata_file(path)
    data = bytearray(path.read_bytes())
    name = b"stream_set_ranges_by_stream"
    at = data.find(name)
    assert at > 0
    data[at + 3] ^= 0x80
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptionError):
        await SqliteMetadataStore.open(path)
