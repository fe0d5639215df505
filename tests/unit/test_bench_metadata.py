"""The ``metadata`` workload run tiny: its rows, its node processes, its PostgreSQL schemas, its flags.

The SQLite-against-SQLite run checks the method on the local store; the PostgreSQL run needs the
server of ``S3STREAM_TEST_PG_URL`` and fails (never skips) without it.
"""

from __future__ import annotations

import os
from pathlib import Path

import psycopg
import pytest

from benchmarks import harness, pgserver
from benchmarks.core import Context, Result
from benchmarks.workloads import metadata

TINY = {
    "streams": "12",
    "nodes": "1,3",
    "warmup_s": "0.05",
    "duration_s": "0.3",
    "ingest_streams": "6",
    "ingest_mib": "1",
    "ingest_rounds": "1",
    "reader_mib": "1",
    "reader_rounds": "1",
}


def _tiny(tmp_path: Path, **params: str) -> Context:
    return Context(quick=True, work_dir=tmp_path, s3=None, params={**TINY, **params})


def _check_rows(results: list[Result], subject: str) -> None:
    commits = [r for r in results if r.metric.endswith(("1 node", "3 nodes"))]
    assert len(commits) == 3 * 2, [r.metric for r in results]
    for row in commits:
        assert row.value > 0
        assert row.baseline_value > 0
        assert row.extra["subject"] == f"{subject} metadata store"
        nodes = row.extra["nodes"]
        assert len(row.extra["ops_by_node"]) == len(row.extra["baseline_ops_by_node"]) == nodes
        assert all(ops > 0 for ops in row.extra["ops_by_node"] + row.extra["baseline_ops_by_node"])
        assert row.extra["latency_ms"]["count"] == sum(row.extra["ops_by_node"])
    ingest = next(r for r in results if "ingest" in r.metric)
    assert ingest.value > 0
    assert ingest.baseline_value > 0
    assert ingest.extra["runs"][0]["objects_committed"] >= 1
    reader = next(r for r in results if "reader catch-up" in r.metric)
    assert reader.extra["payload_bytes_read"] == reader.extra["payload_bytes"] == 1 << 20
    assert reader.value > 0
    assert reader.baseline_value > 0
    assert len(reader.extra["reader_cpu_s_per_gib"]) == len(reader.extra["reader_s_rounds"]) == 1
    assert len(reader.extra["raw_cpu_s_per_gib"]) == len(reader.extra["raw_s_rounds"]) == 1
    assert min(reader.extra["reader_cpu_s_per_gib"] + reader.extra["raw_cpu_s_per_gib"]) > 0


async def test_sqlite_against_sqlite_gives_every_row_from_separate_node_processes(tmp_path: Path) -> None:
    ctx = _tiny(tmp_path, subject="sqlite")
    results = await metadata.run(ctx)
    _check_rows(results, "SQLite")
    assert len(results) == 3 * 2 + 2
    assert any("both sides" in note for note in ctx.notes)


async def test_pin_puts_each_node_process_on_one_core(tmp_path: Path) -> None:
    ctx = _tiny(tmp_path, subject="sqlite", sections="commits", operations="kv")
    ctx.pin = True
    results = await metadata.run(ctx)
    cpus = sorted(os.sched_getaffinity(0))
    for row in results:
        assert row.extra["cpus_by_node"] == [[cpus[i % len(cpus)]] for i in range(row.extra["nodes"])]


async def test_postgresql_against_sqlite_uses_fresh_schemas_and_drops_them(tmp_path: Path) -> None:
    base_url = os.environ.get(pgserver.PG_URL_ENV)
    if not base_url:
        pytest.fail(
            f"{pgserver.PG_URL_ENV} is not set: run scripts/postgres start; eval $(scripts/postgres env)"
        )

    def bench_schemas() -> set[str]:
        with psycopg.connect(base_url, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT nspname FROM pg_namespace WHERE nspname LIKE %s", (pgserver.SCHEMA_PREFIX + "%",)
            ).fetchall()
        return {row[0] for row in rows}

    before = bench_schemas()
    ctx = _tiny(tmp_path)
    ctx.metadata_url = base_url
    results = await metadata.run(ctx)
    _check_rows(results, "PostgreSQL")
    assert bench_schemas() == before


def test_no_postgresql_is_an_error_naming_the_ways_to_give_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(pgserver.PG_URL_ENV, raising=False)
    monkeypatch.setattr(pgserver, "PG_SCRIPT", Path("/nonexistent/scripts/postgres"))
    with pytest.raises(pgserver.NoPostgresError, match="--metadata-url"):
        pgserver.resolve_pg_url(None, print)
    with pytest.raises(pgserver.NoPostgresError, match="postgresql://"):
        pgserver.resolve_pg_url("sqlite:///tmp/x.db", print)


def test_metadata_url_flag_reaches_the_context_and_is_hidden_in_result_files() -> None:
    args = harness.build_parser().parse_args(["metadata", "--pg-url", "postgresql://u:pw@h/db", "--pin"])
    assert args.metadata_url == "postgresql://u:pw@h/db"
    assert args.pin
    argv = ["metadata", "--metadata-url", "postgresql://u:pw@h/db", "--pg-url=postgresql://u:pw@h/db"]
    assert "pw" not in " ".join(harness.redact_argv(argv))


def test_redacted_url_has_no_password() -> None:
    assert pgserver.redacted("postgresql://u:secret@h:5/db?options=x") == "postgresql://u:***@h:5/db"
