"""Shared fixtures: the S3 test server and a fresh prefix on it, a fresh PostgreSQL schema
(``pg_url``), the replayable seed.

The helpers behind them, and every other piece of test support, live in :mod:`tests.support`.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from tests.support.fault_proxy import fault_proxies  # noqa: F401 - the fixture, for every test module
from tests.support.postgres import pg_url  # noqa: F401 - the fixture, for every test module
from tests.support.s3 import REQUIRE_S3_ENV, S3TestServer, delete_prefix, s3_from_env, s3_required


@pytest.fixture(scope="session")
def s3_server() -> S3TestServer:
    """The S3 server from S3STREAM_TEST_S3_*; fails when S3STREAM_REQUIRE_S3=1 and none is set."""
    server = s3_from_env()
    if server is None:
        if s3_required():
            pytest.fail(f"{REQUIRE_S3_ENV}=1 but S3STREAM_TEST_S3_ENDPOINT is not set")
        pytest.skip("no S3 server: run scripts/ceph-rgw start and eval $(scripts/ceph-rgw env)")
    return server


@pytest.fixture
def s3_prefix() -> Iterator[str]:
    """A fresh key prefix so tests sharing a bucket never see each other's objects; whatever a test
    leaves under it on the S3 test server (objects of its engine, SlateDB's files, ...) is deleted after."""
    prefix = f"t-{uuid.uuid4().hex[:12]}/"
    yield prefix
    server = s3_from_env()
    if server is not None:
        delete_prefix(server, prefix)


@pytest.fixture
def rng_seed() -> int:
    """A random seed, printed so a failure can be replayed with S3STREAM_SEED=<seed>."""
    seed = int(os.environ.get("S3STREAM_SEED", uuid.uuid4().int % 2**32))
    print(f"seed={seed} (replay with S3STREAM_SEED={seed})")
    return seed
