"""The engine's API suite and stateful test with PostgreSQL metadata (LocalObjectStorage objects).

Every ``test_*`` of ``tests.unit.test_engine`` is re-run here with the ``Node`` helper's metadata
swapped for a :class:`~s3stream.metadata.postgres.PostgresMetadataStore` in a fresh schema of the
server named by ``S3STREAM_TEST_PG_URL`` (dropped when the test ends; the test FAILS when the variable
is unset) and its object storage for a :class:`~s3stream.storage.local.LocalObjectStorage` in a tmp
dir (see ``tests/support/backends.py``; the WAL stays the twin the suite inspects). The same suite
runs on SQLite metadata in ``tests/unit/test_engine_local_backend.py`` and, with Ceph RGW objects,
in ``tests/integration/test_engine_backends.py``. A failing test's captured output names the schema.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

import tests.unit.test_engine as suite
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
``<name>_waiting`` variants instead (``tests/support/backends.py``)."""

globals().update(export_suite(suite, RUN_AS_VARIANTS))
globals().update(waiting_variant_tests(suite, "postgres_backend"))


@pytest.fixture
async def postgres_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[None]:
    """The suite's ``Node`` builds on LocalObjectStorage under ``tmp_path`` and PostgreSQL schemas."""
    backend = Backend("local", tmp_path, metadata_kind="postgresql")
    try:
        await backend.open_metadata()
        with patch_suite(monkeypatch, suite, backend):
            yield
    finally:
        await backend.aclose()


@pytest.fixture(autouse=True)
def _suite_on_postgres(request: pytest.FixtureRequest) -> None:
    if is_suite_test(request, suite):
        request.getfixturevalue("postgres_backend")


@pytest.mark.usefixtures("postgres_backend")
async def test_the_suite_builds_its_nodes_on_postgres() -> None:
    from s3stream.metadata.postgres import PostgresMetadataStore

    check_suite_builds_on(suite, LocalObjectStorage, PostgresMetadataStore)


def test_engine_stateful_on_postgres() -> None:
    machine = backend_machine(lambda root: Backend("local", root, metadata_kind="postgresql"))
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=15,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
