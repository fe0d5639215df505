"""``s3stream compact`` on a real embedded data dir (block WAL, SQLite, local objects)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from s3stream.cli import main
from tests.support.configs import SMALL_TOML

CONFIG = SMALL_TOML + '"s3.object.delete.retention.minutes" = 0\n'


def run_json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> object:
    code = main([*argv, "--json"])
    out = capsys.readouterr().out
    assert code == 0, out
    return json.loads(out)


def test_compact_merges_the_objects_of_several_runs_and_fetch_still_returns_every_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "s3stream.toml"
    config.write_text(CONFIG)
    args = ["--data-dir", str(tmp_path / "data"), "--config", str(config)]
    for _ in range(3):  # each run closes its streams: one StreamSet object per run
        assert main(["produce", *args, "--streams", "3", "--count", "5", "--size", "100"]) == 0
        capsys.readouterr()
    objects = run_json(capsys, ["objects", *args])
    assert isinstance(objects, list)
    assert sum(o["state"] == "COMMITTED" for o in objects) == 3
    report = run_json(capsys, ["compact", *args])
    assert isinstance(report, dict)
    assert report["stream_set_objects_compacted"] == 3
    assert report["stream_set_objects_written"] == 1
    assert report["gc.deleted_count"] == 3
    assert report["problems"] == "-"
    objects = run_json(capsys, ["objects", *args])
    assert isinstance(objects, list)
    assert [o["state"] for o in objects] == ["COMMITTED"]
    assert sorted(p.name for p in (tmp_path / "data" / "objects").rglob("*") if p.is_file()) == [
        str(objects[0]["object_id"])
    ]
    for stream_id in range(3):
        rows = run_json(capsys, ["fetch", *args, "--stream", str(stream_id)])
        assert isinstance(rows, list)
        assert [r["offset"] for r in rows] == list(range(15))


def test_compact_prints_a_table_without_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "data").mkdir()  # compact, like every command that only reads, needs an existing data dir
    assert main(["compact", "--data-dir", str(tmp_path / "data")]) == 0
    out = capsys.readouterr().out
    assert "stream_set_objects_compacted" in out
    assert "gc.orphan_deleted_count" in out
