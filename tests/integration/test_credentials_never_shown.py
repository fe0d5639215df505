"""No credential reaches a log line or an exception, on real S3 and PostgreSQL failures.

Each case fails for real: Ceph RGW refusing a wrong secret key, an S3 endpoint nobody listens on, a
bucket that does not exist, PostgreSQL refusing a wrong password (and a server nobody listens on).
Logging is on at DEBUG for every logger (botocore, aiobotocore, psycopg included). Checked:

* the lines the CLI's logging setup writes (kv format, redaction filter) hold no secret;
* the records as the libraries and the engine made them (before any filter) hold no secret either:
  the filter is the last defence, not the only one;
* the exception raised: its str, its repr, its args, and those of every cause and context in its
  chain, and its formatted traceback hold no secret;
* the command line in a real process (``--log-level debug``): stdout and stderr hold no secret.

Each secret is a distinct random string, also checked by its first 10 characters (a secret cut short
is still a leak).
"""

from __future__ import annotations

import io
import logging
import os
import socket
import subprocess
import sys
import traceback
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from s3stream.assembly import open_client
from s3stream.errors import S3StreamError
from s3stream.logfmt import setup_logging
from s3stream.metadata.url import open_metadata_store, parse_metadata_url
from s3stream.model import RecordBatch
from tests.support.configs import small_config
from tests.support.s3 import S3TestServer

ROOT = Path(__file__).resolve().parents[2]
CONFIG = small_config(close_timeout_ms=2_000, metadata_copy_wait_ms=2_000)


def _secret(kind: str) -> str:
    return f"{kind}{uuid.uuid4().hex}"


class _Raw(logging.Handler):
    """Every record as made (message, args rendered, traceback), before any filter."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
        except (TypeError, ValueError):
            text = f"{record.msg!r} {record.args!r}"
        if record.exc_info and record.exc_info[1] is not None:
            text += "\n" + "".join(traceback.format_exception(record.exc_info[1]))
        self.lines.append(f"{record.name}: {text}")


class Captured:
    def __init__(self) -> None:
        self.out = io.StringIO()
        self.raw = _Raw()


@pytest.fixture
def captured() -> Iterator[Captured]:
    """DEBUG logging of every logger into the CLI's handler (kv + redaction) and a raw handler."""
    root = logging.getLogger()
    level = root.level
    cap = Captured()
    root.addHandler(cap.raw)  # first: sees records before the CLI handler's filter rewrites them
    handler = setup_logging("kv", logging.DEBUG, cap.out)
    try:
        yield cap
    finally:
        root.removeHandler(handler)
        root.removeHandler(cap.raw)
        root.setLevel(level)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo.extend(x for x in (e.__cause__, e.__context__) if x is not None)
        if isinstance(e, BaseExceptionGroup):
            todo.extend(e.exceptions)


def _assert_absent(secret: str, where: str, text: str, *, partial: bool = True) -> None:
    for probe in (secret, secret[:10]) if partial else (secret,):
        assert probe not in text, (
            f"{probe!r} found in {where}:\n{text[max(0, text.find(probe) - 300) :][:600]}"
        )


def _assert_clean(secret: str, cap: Captured, exc: BaseException | None, *, partial: bool = True) -> None:
    """``partial``: also look for the secret's first 10 characters (only for a random secret: the test
    server's own secret key shares its start with its access key, which the signed headers show)."""
    _assert_absent(secret, "the CLI's log lines", cap.out.getvalue(), partial=partial)
    _assert_absent(secret, "the raw log records", "\n".join(cap.raw.lines), partial=partial)
    if exc is not None:
        for e in _chain(exc):
            _assert_absent(secret, f"str({type(e).__name__})", str(e), partial=partial)
            _assert_absent(secret, f"repr({type(e).__name__})", repr(e), partial=partial)
            _assert_absent(secret, f"{type(e).__name__}.args", repr(e.args), partial=partial)
        _assert_absent(secret, "the traceback", "".join(traceback.format_exception(exc)), partial=partial)


def test_the_checks_see_a_secret_anywhere_in_the_chain(captured: Captured) -> None:
    secret = _secret("Probe")
    try:
        try:
            raise OSError(f"connect failed for {secret[:12]}...")
        except OSError as inner:
            raise S3StreamError("storage unavailable") from inner
    except S3StreamError as exc:
        with pytest.raises(AssertionError, match="found in str"):
            _assert_clean(secret, captured, exc)
    logging.getLogger("probe").debug("key %s", secret)  # not a registered secret: the filter keeps it
    with pytest.raises(AssertionError, match="found in the CLI's log lines"):
        _assert_clean(secret, captured, None)
    assert any(secret in line for line in captured.raw.lines)


def _uri(server: S3TestServer, *, bucket: str, endpoint: str, secret: str | None, prefix: str = "") -> str:
    keys = f"&accessKey={urllib.parse.quote(server.access_key)}&secretKey={secret}" if secret else ""
    return (
        f"0@s3://{bucket}?region={server.region}&endpoint={urllib.parse.quote(endpoint, safe=':/')}"
        f"&pathStyle=true&apiCallTimeoutMs=3000&apiCallAttemptTimeoutMs=1000{keys}"
        + (f"&prefix={prefix}" if prefix else "")
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _open_and_write(tmp_path: Path, uri: str) -> BaseException | None:
    """Open a client on ``uri``, append and close (forcing an upload); the error it ends with."""
    try:
        client = await open_client(tmp_path / "data", bucket_uri=uri, config=CONFIG)
    except S3StreamError as exc:
        return exc
    try:
        stream = await client.streams.create_and_open_stream()
        await stream.append(RecordBatch(b"x" * 1000))
        await stream.close()
    except S3StreamError as exc:
        return exc
    finally:
        try:
            await client.close()
        except S3StreamError as exc:
            return exc
    return None


async def test_a_wrong_secret_key_on_ceph_rgw(
    s3_server: S3TestServer, s3_prefix: str, tmp_path: Path, captured: Captured
) -> None:
    secret = _secret("WrongS3Secret")
    uri = _uri(
        s3_server, bucket=s3_server.bucket, endpoint=s3_server.endpoint, secret=secret, prefix=s3_prefix
    )
    exc = await _open_and_write(tmp_path, uri)
    assert exc is not None, "RGW accepted a wrong secret key"
    assert "credentials" in str(exc)
    assert captured.raw.lines, "DEBUG logging captured nothing: the check would be empty"
    _assert_clean(secret, captured, exc)


async def test_an_unreachable_endpoint(s3_server: S3TestServer, tmp_path: Path, captured: Captured) -> None:
    secret = _secret("UnreachableSecret")
    endpoint = f"http://127.0.0.1:{_free_port()}"
    exc = await _open_and_write(tmp_path, _uri(s3_server, bucket="b", endpoint=endpoint, secret=secret))
    assert captured.raw.lines
    _assert_clean(secret, captured, exc)
    assert exc is not None or "did not answer" in captured.out.getvalue()


async def test_a_missing_bucket(s3_server: S3TestServer, tmp_path: Path, captured: Captured) -> None:
    secret = s3_server.secret_key  # the right secret: it must not show either
    bucket = f"s3stream-missing-{uuid.uuid4().hex[:8]}"
    exc = await _open_and_write(
        tmp_path, _uri(s3_server, bucket=bucket, endpoint=s3_server.endpoint, secret=secret)
    )
    assert exc is not None
    assert "NoSuchBucket" in str(exc)
    _assert_clean(secret, captured, exc, partial=False)


async def test_secrets_from_the_environment(
    s3_server: S3TestServer,
    s3_prefix: str,
    tmp_path: Path,
    captured: Captured,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    secret = _secret("EnvSecret")
    monkeypatch.setenv("KAFKA_S3_ACCESS_KEY", s3_server.access_key)
    monkeypatch.setenv("KAFKA_S3_SECRET_KEY", secret)
    uri = _uri(s3_server, bucket=s3_server.bucket, endpoint=s3_server.endpoint, secret=None, prefix=s3_prefix)
    exc = await _open_and_write(tmp_path, uri)
    assert exc is not None
    _assert_clean(secret, captured, exc)


def _with_password(url: str, password: str, *, port: int | None = None) -> str:
    parts = urllib.parse.urlsplit(url)
    user = parts.username or "postgres"
    host = parts.hostname or "127.0.0.1"
    netloc = f"{user}:{password}@{host}:{port or parts.port or 5432}"
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


@pytest.mark.parametrize("server", ["running", "down"])
async def test_a_postgresql_url_whose_password_fails(
    pg_url: str, tmp_path: Path, captured: Captured, server: str
) -> None:
    password = _secret("PgPassword")
    url = _with_password(pg_url, password, port=_free_port() if server == "down" else None)
    exc: BaseException | None = None
    try:
        store = await open_metadata_store(parse_metadata_url(url))
    except S3StreamError as e:
        exc = e
    else:
        await store.close()
    assert exc is not None, "PostgreSQL accepted a wrong password (does the test server trust every login?)"
    _assert_clean(password, captured, exc)
    config = small_config(metadata_url=url)
    try:
        client = await open_client(tmp_path / "data", bucket_uri="mem://creds", config=config)
    except S3StreamError as e:
        exc = e
    else:
        await client.close()
        pytest.fail("the client opened on a wrong password")
    _assert_clean(password, captured, exc)


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "s3stream", "--log-level", "debug", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        check=False,
    )


def test_the_command_line_in_a_real_process(
    s3_server: S3TestServer, s3_prefix: str, pg_url: str, tmp_path: Path
) -> None:
    s3_secret = _secret("CliS3Secret")
    uri = _uri(
        s3_server, bucket=s3_server.bucket, endpoint=s3_server.endpoint, secret=s3_secret, prefix=s3_prefix
    )
    produced = _cli("produce", "--data-dir", str(tmp_path / "d1"), "--bucket-uri", uri, "--count", "3")
    assert produced.returncode != 0
    assert "error:" in produced.stderr
    _assert_absent(s3_secret, "produce's stderr", produced.stderr)
    _assert_absent(s3_secret, "produce's stdout", produced.stdout)

    password = _secret("CliPgPassword")
    streams = _cli("streams", "--metadata-url", _with_password(pg_url, password))
    assert streams.returncode == 2, streams.stderr
    assert streams.stderr.strip(), "no error shown"
    _assert_absent(password, "streams' stderr", streams.stderr)
    _assert_absent(password, "streams' stdout", streams.stdout)
