"""The engine's API suite and stateful test on the local backend: LocalObjectStorage and SQLite files.

Every ``test_*`` of ``tests.unit.test_engine`` is re-run here with the ``Node`` helper's object
storage swapped for a :class:`~s3stream.storage.local.LocalObjectStorage` in a tmp dir and its
metadata for a :class:`~s3stream.metadata.sqlite.SqliteMetadataStore` in a tmp file (see
``tests/support/backends.py``; the WAL stays the twin the suite inspects). Node ids name this module,
and a failing test's captured output names the backend and its directory.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

import tests.unit.test_engine as suite
from s3stream.metadata.sqlite import SqliteMetadataStore
from s3stream.storage.local import LocalObjectStorage
from tests.support.backends import (
    WAITING_VARIANTS,
    Backend,
    backend_machine,
    check_suite_builds_on,
    export_suite,
    is_suite_test,
    patch_suite,
    waiting_variant_tests,
)

RUN_AS_VARIANTS: dict[str, str] = {name: reason for name, (reason, _) in WAITING_VARIANTS.items()}
"""Suite tests not re-run as they are, with the reason: they assume the twin's timing, and run as
``<name>_waiting`` variants instead (``tests/support/backends.py``). The outage tests patch ``upload``
on the storage instance, which works on every backend, so none is left out for its hooks."""

globals().update(export_suite(suite, RUN_AS_VARIANTS))
globals().update(waiting_variant_tests(suite, "local_backend"))


@pytest.fixture
async def local_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[None]:
    """The suite's ``Node`` builds on LocalObjectStorage and SQLite under ``tmp_path``."""
    backend = Backend("local", tmp_path)
    try:
        await backend.open_metadata()
        with patch_suite(monkeypatch, suite, backend):
            yield
    finally:
        await backend.aclose()


@pytest.fixture(autouse=True)
def _suite_on_local_backend(request: pytest.FixtureRequest) -> None:
    if is_suite_test(request, suite):
        request.getfixturevalue("local_backend")


@pytest.mark.usefixtures("local_backend")
async def test_the_suite_builds_its_nodes_on_local_backend() -> None:
    check_suite_builds_on(suite, LocalObjectStorage, SqliteMetadataStore)


def test_engine_stateful_on_local_backend() -> None:
    machine = backend_machine(lambda root: Backend("local", root))
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=15,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
