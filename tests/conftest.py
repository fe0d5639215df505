"""Shared fixtures: the S3 test server from the environment, temporary directories."""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from benchmarks.core import S3Target


@dataclass(frozen=True)
class S3TestServer:
    """An S3-compatible endpoint for integration tests (the project's Ceph RGW, MinIO, AWS, ...)."""

    endpoint: str
    access_key: str
    secret_key: str
    bucket: str
    region: str

    def uri(self, prefix: str = "") -> str:
        """An AutoMQ-style bucket URI for this server (keys inline)."""
        from urllib.parse import quote

        return (
            f"0@s3://{self.bucket}?region={self.region}&endpoint={quote(self.endpoint, safe=':/')}"
            f"&pathStyle=true&accessKey={quote(self.access_key)}&secretKey={quote(self.secret_key)}"
            + (f"&prefix={quote(prefix)}" if prefix else "")
        )

    def bench_target(self) -> S3Target:
        """This server as a benchmark target (:class:`benchmarks.core.S3Target`)."""
        from benchmarks.core import S3Target

        return S3Target(
            endpoint=self.endpoint,
            access_key=self.access_key,
            secret_key=self.secret_key,
            bucket=self.bucket,
            region=self.region,
        )


def _s3_from_env() -> S3TestServer | None:
    endpoint = os.environ.get("S3STREAM_TEST_S3_ENDPOINT")
    if not endpoint:
        return None
    return S3TestServer(
        endpoint=endpoint,
        access_key=os.environ["S3STREAM_TEST_S3_ACCESS_KEY"],
        secret_key=os.environ["S3STREAM_TEST_S3_SECRET_KEY"],
        bucket=os.environ.get("S3STREAM_TEST_S3_BUCKET", "s3stream-test"),
        region=os.environ.get("S3STREAM_TEST_S3_REGION", "us-east-1"),
    )


@pytest.fixture(scope="session")
def s3_server() -> S3TestServer:
    """The S3 server from S3STREAM_TEST_S3_*; fails when S3STREAM_REQUIRE_S3=1 and none is set."""
    server = _s3_from_env()
    if server is None:
        if os.environ.get("S3STREAM_REQUIRE_S3") == "1":
            pytest.fail("S3STREAM_REQUIRE_S3=1 but S3STREAM_TEST_S3_ENDPOINT is not set")
        pytest.skip("no S3 server: run scripts/ceph-rgw start and eval $(scripts/ceph-rgw env)")
    return server


@pytest.fixture
def s3_prefix() -> Iterator[str]:
    """A fresh key prefix so tests sharing a bucket never see each other's objects; whatever a test
    leaves under it on the S3 test server (objects of its engine, SlateDB's files, ...) is deleted after."""
    prefix = f"t-{uuid.uuid4().hex[:12]}/"
    yield prefix
    server = _s3_from_env()
    if server is not None:
        _delete_prefix(server, prefix)


def _delete_prefix(server: S3TestServer, prefix: str) -> None:
    """In a thread of its own: the test's event loop (pytest-asyncio's) must not be touched."""
    from benchmarks.baselines import delete_prefix

    failures: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(delete_prefix(server.bench_target(), prefix))
        except BaseException as exc:  # reported below, on the test's thread
            failures.append(exc)

    thread = threading.Thread(target=run, name="s3-prefix-cleanup")
    thread.start()
    thread.join()
    if failures:
        raise failures[0]


@pytest.fixture
def rng_seed() -> int:
    """A random seed, printed so a failure can be replayed with S3STREAM_SEED=<seed>."""
    seed = int(os.environ.get("S3STREAM_SEED", uuid.uuid4().int % 2**32))
    print(f"seed={seed} (replay with S3STREAM_SEED={seed})")
    return seed
