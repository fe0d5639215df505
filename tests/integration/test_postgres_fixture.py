"""The PostgreSQL test fixture fails, never skips, when no server is configured."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.postgres import PG_URL_ENV, with_search_path

ROOT = Path(__file__).resolve().parents[2]


def test_a_test_needing_postgres_fails_when_no_server_is_configured() -> None:
    env = {k: v for k, v in os.environ.items() if k != PG_URL_ENV}
    result = subprocess.run(
        [
            sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
            "tests/integration/test_metadata_postgres.py::test_a_fresh_schema_gets_sqlites_tables_at_the_latest_version",
        ],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode != 0, result.stdout[-2000:]
    assert "1 error" in result.stdout or "1 failed" in result.stdout, result.stdout[-2000:]
    assert "skipped" not in result.stdout
    assert f"{PG_URL_ENV} is not set" in result.stdout


def test_the_search_path_option_replaces_any_other_options() -> None:
    url = "postgresql://u:p@h:5432/db?sslmode=disable&options=-cwork_mem%3D4MB"
    assert with_search_path(url, "t_1") == (
        "postgresql://u:p@h:5432/db?sslmode=disable&options=-csearch_path%3Dt_1"
    )
