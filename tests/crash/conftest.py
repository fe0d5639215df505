"""Crash-test fixtures: the object store of the engine and compaction crash tests."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.crash.backend import BUCKET_URI_ENV
from tests.support.s3 import S3TestServer


@pytest.fixture
def crash_bucket(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str | None]:
    """With ``S3STREAM_CRASH_S3=1``: a fresh prefix on the S3 test server, exported in
    ``S3STREAM_CRASH_BUCKET_URI`` for the test's child processes (deleted after the test by ``s3_prefix``);
    otherwise None (each data dir keeps its objects in a local directory)."""
    if os.environ.get("S3STREAM_CRASH_S3") != "1":
        monkeypatch.delenv(BUCKET_URI_ENV, raising=False)
        yield None
        return
    server: S3TestServer = request.getfixturevalue("s3_server")
    prefix: str = request.getfixturevalue("s3_prefix")
    uri = server.uri(prefix)
    monkeypatch.setenv(BUCKET_URI_ENV, uri)
    yield uri
