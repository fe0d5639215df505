"""Tests that need PostgreSQL FAIL, never skip, when ``S3STREAM_TEST_PG_URL`` is unset.

``tests/integration/test_postgres_fixture.py`` checks the ``pg_url`` fixture alone; this runs one test
of each PostgreSQL-backed suite (whatever way it gets its schema) in a pytest subprocess without the
variable and checks that every one failed (a failing fixture counts as an error) with the message
naming the variable and how to start the server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.postgres import PG_URL_ENV

REPO = Path(__file__).resolve().parents[2]
NEEDS_POSTGRES = (
    "tests/property/test_metadata_postgres_interleavings.py::test_any_interleaving_of_three_nodes_keeps_the_invariants",
    "tests/integration/test_metadata_postgres.py::TestPostgresMetadataStore::test_register_node_fences_an_older_epoch",
    "tests/integration/test_metadata_postgres_race.py::"
    "test_processes_racing_on_shared_streams_lose_no_update_and_keep_every_fence",
    "tests/integration/test_engine_postgres.py::test_the_suite_builds_its_nodes_on_postgres",
    "tests/integration/test_engine_postgres.py::test_engine_stateful_on_postgres",
    "tests/crash/test_metadata_commit_crash.py::test_sigkill_mid_commit_leaves_every_commit_whole[postgresql]",
    "tests/property/test_metadata_races.py::test_concurrent_nodes_lose_no_update_and_every_fence_holds[postgresql]",
)


def test_postgres_tests_fail_without_a_server_url() -> None:
    env = {k: v for k, v in os.environ.items() if k != PG_URL_ENV}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfEs", *NEEDS_POSTGRES],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    summary = done.stdout.strip().splitlines()[-1]
    assert done.returncode == 1, done.stdout[-3000:]
    counts = {word: int(n) for n, word in (part.split()[:2] for part in summary.split(" in ")[0].split(", "))}
    assert counts.get("failed", 0) + counts.get("error", 0) + counts.get("errors", 0) == len(
        NEEDS_POSTGRES
    ), summary
    assert set(counts) <= {"failed", "error", "errors"}, summary  # nothing passed, nothing skipped
    assert done.stdout.count(f"{PG_URL_ENV} is not set") >= len(NEEDS_POSTGRES), done.stdout[-3000:]
    assert "scripts/postgres start" in done.stdout
