"""``s3.metadata.url``: parsing, and a description that never shows a password."""

from __future__ import annotations

import pytest

from s3stream.errors import InvalidArgumentError
from s3stream.metadata.url import parse_metadata_url


@pytest.mark.parametrize(
    ("url", "secret"),
    [
        ("postgresql://alice:s3cr3t@db.example:5432/meta", "s3cr3t"),
        ("postgresql://alice@db.example/meta?password=s3cr3t&sslmode=require", "s3cr3t"),
        ("postgresql://alice@db.example/meta?PASSWORD=s3cr3t", "s3cr3t"),
        ("postgresql://db.example/meta?options=-c%20password%3Ds3cr3t", "s3cr3t"),
    ],
)
def test_describe_hides_every_password(url: str, secret: str) -> None:
    described = parse_metadata_url(url).describe()
    assert secret not in described
    assert "***" in described
    assert "db.example" in described


def test_describe_keeps_a_url_without_a_password() -> None:
    url = "postgresql://alice@db.example:5432/meta?sslmode=require"
    assert parse_metadata_url(url).describe() == url


@pytest.mark.parametrize(
    ("url", "kind", "path"),
    [("sqlite:///var/lib/m.db", "sqlite", "/var/lib/m.db"), ("sqlite:rel/m.db", "sqlite", "rel/m.db")],
)
def test_sqlite_urls(url: str, kind: str, path: str) -> None:
    parsed = parse_metadata_url(url)
    assert (parsed.kind, parsed.sqlite_path, parsed.describe()) == (kind, path, url)


@pytest.mark.parametrize(
    "url",
    [
        "",
        "metadata.db",
        "sqlite://relative.db",
        "sqlite:///",
        "mysql://h/db",
        "postgresql://h",
        "postgresql://h:99999/db",
    ],
)
def test_bad_urls_are_refused(url: str) -> None:
    with pytest.raises(InvalidArgumentError):
        parse_metadata_url(url)


async def test_four_slashes_name_the_same_absolute_file(tmp_path: object) -> None:
    from pathlib import Path

    from s3stream.metadata.url import open_metadata_store

    db = Path(str(tmp_path)) / "m.db"
    parsed = parse_metadata_url("sqlite:///" + str(db))
    assert parsed.sqlite_path == str(db)
    store = await open_metadata_store(parsed)  # a file: URI with an authority was refused by SQLite
    await store.close()
    assert db.exists()
