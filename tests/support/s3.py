"""The S3 test server from the environment (``S3STREAM_TEST_S3_*``), storage on it, and prefix cleanup.

The fixtures in ``tests/conftest.py`` use these: ``s3_server`` (skips without a server, FAILS when
``S3STREAM_REQUIRE_S3=1``) and ``s3_prefix`` (a fresh key prefix, deleted after the test).
"""

from __future__ import annotations

import asyncio
import os
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from benchmarks.core import S3Target
    from s3stream.storage.s3 import S3Config, S3ObjectStorage

REQUIRE_S3_ENV = "S3STREAM_REQUIRE_S3"


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

    def s3_config(self, prefix: str = "", **changes: Any) -> S3Config:
        """An :class:`~s3stream.storage.s3.S3Config` for this server (path style, keys inline), the
        backend's defaults except ``changes``."""
        from s3stream.storage.s3 import S3Config

        return S3Config(
            bucket=self.bucket,
            endpoint=self.endpoint,
            region=self.region,
            path_style=True,
            access_key=self.access_key,
            secret_key=self.secret_key,
            prefix=prefix,
            **changes,
        )

    def storage(self, prefix: str = "", **changes: Any) -> S3ObjectStorage:
        """An :class:`~s3stream.storage.s3.S3ObjectStorage` on :meth:`s3_config` (the caller closes it)."""
        from s3stream.storage.s3 import S3ObjectStorage

        return S3ObjectStorage(self.s3_config(prefix, **changes))

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


def s3_from_env() -> S3TestServer | None:
    """The server named by ``S3STREAM_TEST_S3_*``, or None when no endpoint is set."""
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


def s3_required() -> bool:
    """True when a missing S3 server must fail the tests instead of skipping them."""
    return os.environ.get(REQUIRE_S3_ENV) == "1"


def delete_prefix(server: S3TestServer, prefix: str) -> None:
    """Delete every object under ``prefix``, in a thread of its own: the test's event loop
    (pytest-asyncio's) must not be touched."""
    from benchmarks.baselines import delete_prefix as delete_target_prefix

    failures: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(delete_target_prefix(server.bench_target(), prefix))
        except BaseException as exc:  # reported below, on the test's thread
            failures.append(exc)

    thread = threading.Thread(target=run, name="s3-prefix-cleanup")
    thread.start()
    thread.join()
    if failures:
        raise failures[0]
