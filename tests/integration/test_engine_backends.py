"""The engine's API suite and stateful test on Ceph RGW: S3ObjectStorage and SQLite files.

Every ``test_*`` of ``tests.unit.test_engine`` is re-run here with the ``Node`` helper's object
storage swapped for an :class:`~s3stream.storage.s3.S3ObjectStorage` (opened from the test server's
bucket URI) under a fresh key prefix per storage, and its metadata for a SQLite file (see
``tests/support/backends.py``; the WAL stays the twin the suite inspects). The objects are deleted
when the test ends. Node ids name this module, and a failing test's captured output names the
backend and its key prefix. The local backend runs in ``tests/unit/test_engine_local_backend.py``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

import tests.unit.test_engine as suite
from s3stream.metadata.sqlite import SqliteMetadataStore
from s3stream.storage.s3 import S3ObjectStorage
from tests.support.backends import (
    WAITING_VARIANTS,
    Backend,
    backend_machine,
    check_suite_builds_on,
    export_suite,
    is_suite_test,
    patch_suite,
    s3_backend_factory,
    waiting_variant_tests,
)
from tests.support.s3 import S3TestServer

pytestmark = pytest.mark.integration

RUN_AS_VARIANTS: dict[str, str] = {name: reason for name, (reason, _) in WAITING_VARIANTS.items()}
"""Suite tests not re-run as they are, with the reason: they assume the twin's timing, and run as
``<name>_waiting`` variants instead (``tests/support/backends.py``). The outage tests patch ``upload``
on the storage instance, which works on every backend, so none is left out for its hooks."""

globals().update(export_suite(suite, RUN_AS_VARIANTS))
globals().update(waiting_variant_tests(suite, "s3_backend"))


@pytest.fixture
async def s3_backend(
    s3_server: S3TestServer, s3_prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[None]:
    """The suite's ``Node`` builds on S3 under ``s3_prefix`` and SQLite under ``tmp_path``."""
    backend = Backend("s3", tmp_path, s3_server, s3_prefix)
    try:
        await backend.open_metadata()
        with patch_suite(monkeypatch, suite, backend):
            yield
    finally:
        await backend.aclose()


@pytest.fixture(autouse=True)
def _suite_on_s3(request: pytest.FixtureRequest) -> None:
    if is_suite_test(request, suite):
        request.getfixturevalue("s3_backend")


@pytest.mark.usefixtures("s3_backend")
async def test_the_suite_builds_its_nodes_on_s3() -> None:
    check_suite_builds_on(suite, S3ObjectStorage, SqliteMetadataStore)


def test_engine_stateful_on_s3(s3_server: S3TestServer, s3_prefix: str) -> None:
    machine = backend_machine(s3_backend_factory(s3_server, s3_prefix))
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=12,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
