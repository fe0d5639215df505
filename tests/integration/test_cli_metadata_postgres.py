"""The CLI on PostgreSQL metadata (``--metadata-url postgresql://...``), against the real server of
``S3STREAM_TEST_PG_URL`` (a fresh schema per test; the test FAILS when the variable is unset).

Every command runs with the URL; the read commands need no data dir and run in a read-only session
(the server refuses a write through it); a server that does not answer is one line and exit code 2;
no output holds the password.
"""

from __future__ import annotations

import asyncio
import json
import os
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from s3stream.cli import main
from s3stream.cli._metadata import open_metadata_read_only
from s3stream.cli.fetch import preview
from s3stream.cli.produce import generated_payload
from s3stream.errors import S3StreamError
from s3stream.metadata.url import parse_metadata_url, read_only_url
from tests.support.configs import SMALL_TOML

PG_URL_ENV = "S3STREAM_TEST_PG_URL"


def pg_base_url() -> str:
    url = os.environ.get(PG_URL_ENV)
    if not url:
        pytest.fail(f"{PG_URL_ENV} is not set: run scripts/postgres start and eval $(scripts/postgres env)")
    return url


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A URL whose sessions use a fresh, empty schema (dropped after the test)."""
    base = pg_base_url()
    schema = f"t_cli_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    parts = urllib.parse.urlsplit(base)
    query = [*urllib.parse.parse_qsl(parts.query), ("options", f"-csearch_path={schema}")]
    try:
        yield urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


def password_of(url: str) -> str:
    password = urllib.parse.urlsplit(url).password
    assert password, "the test server's URL must carry a password for the no-password checks"
    return password


def test_a_read_commands_session_is_read_only_and_keeps_the_urls_options(pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE probe (v int)")
        schema = conn.execute("SHOW search_path").fetchone()
    with psycopg.connect(read_only_url(parse_metadata_url(pg_url)), autocommit=True) as conn:
        assert conn.execute("SHOW search_path").fetchone() == schema  # the test's schema still
        assert conn.execute("SHOW default_transaction_read_only").fetchone() == ("on",)
        assert conn.execute("SELECT count(*) FROM probe").fetchone() == (0,)
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            conn.execute("INSERT INTO probe VALUES (1)")
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            conn.execute("CREATE TABLE other (v int)")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM probe").fetchone() == (0,)


def test_every_command_works_on_postgres_metadata_and_reads_need_no_data_dir(
    pg_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "s3stream.toml"
    config.write_text(SMALL_TOML)
    bucket = f"file://{tmp_path / 'bucket'}"
    writer = ["--data-dir", str(tmp_path / "data"), "--config", str(config), "--metadata-url", pg_url]
    assert (
        main(["produce", *writer, "--bucket-uri", bucket, "--streams", "2", "--count", "3", "--size", "30"])
        == 0
    )
    assert main(["compact", *writer]) == 0
    assert main(["demo", *writer]) == 0
    capsys.readouterr()
    assert not (tmp_path / "data" / "metadata.db").exists()

    reader = ["--data-dir", str(tmp_path / "none"), "--config", str(config), "--metadata-url", pg_url]

    def run_json(argv: list[str]) -> list[dict[str, object]]:
        assert main([*argv, *reader, "--json"]) == 0
        captured = capsys.readouterr()
        assert password_of(pg_url) not in captured.out + captured.err
        out: list[dict[str, object]] = json.loads(captured.out)
        return out

    streams = run_json(["streams"])
    assert [(s["stream_id"], s["owner"]) for s in streams][:2] == [(0, 0), (1, 0)]
    assert len(streams) == 5  # and the demo's three
    assert run_json(["objects"])
    rows = run_json(["fetch", "--stream", "1"])  # objects from the bucket recorded in PostgreSQL
    assert [r["payload"] for r in rows] == [preview(generated_payload(1, i, 30)) for i in range(3)]
    assert [(n["node_id"], n["lease"]) for n in run_json(["nodes"])] == [(0, "expired")]  # closed
    assert not (tmp_path / "none").exists()


async def test_the_store_a_read_command_opens_refuses_writes(pg_url: str, tmp_path: Path) -> None:
    config = tmp_path / "s3stream.toml"
    config.write_text(SMALL_TOML)
    argv = [
        "produce",
        "--data-dir",
        str(tmp_path / "data"),
        "--config",
        str(config),
        "--metadata-url",
        pg_url,
    ]
    assert await asyncio.to_thread(main, argv) == 0
    store = await open_metadata_read_only(parse_metadata_url(pg_url))
    try:
        before = await store.list_streams()
        with pytest.raises(S3StreamError):
            await store.kv_put("cli-probe", b"x")
        with pytest.raises(S3StreamError):  # a write (closing a CLOSED stream would write nothing)
            await store.prepare_objects(count=1, ttl_ms=60_000)
        assert await store.kv_get("cli-probe") is None
        assert await store.list_streams() == before
    finally:
        await store.close()


def test_an_unreachable_server_is_one_line_and_exit_2_without_the_password(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    secret = "hunter2-not-for-output"
    url = f"postgresql://s3stream:{secret}@127.0.0.1:9/s3stream_test?connect_timeout=2"  # port 9: closed
    for argv in (["streams"], ["nodes"], ["produce", "--count", "1"]):
        code = main([*argv, "--data-dir", str(tmp_path / "data"), "--metadata-url", url])
        captured = capsys.readouterr()
        assert code == 2, captured.err
        assert captured.err.count("\n") == 1, captured.err
        assert secret not in captured.out + captured.err
