"""The engine subcommands (produce, fetch, streams, objects, demo) on a real embedded data dir."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from s3stream.cli import main
from s3stream.cli.fetch import preview
from s3stream.cli.produce import generated_payload

CONFIG = """
"s3.wal.capacity" = "16MiB"
"s3.wal.record.size.max" = "1MiB"
"s3.record.size.max" = "512KiB"
"s3.wal.cache.size" = "8MiB"
"s3.wal.upload.threshold" = "1MiB"
"s3.block.cache.size" = "4MiB"
"""


@pytest.fixture
def engine_args(tmp_path: Path) -> list[str]:
    config = tmp_path / "s3stream.toml"
    config.write_text(CONFIG)
    return ["--data-dir", str(tmp_path / "data"), "--config", str(config)]


def run_json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> list[dict[str, object]]:
    assert main([*argv, "--json"]) == 0
    out: list[dict[str, object]] = json.loads(capsys.readouterr().out)
    return out


def run_produce(capsys: pytest.CaptureFixture[str], argv: list[str]) -> list[dict[str, object]]:
    """The acknowledgement lines of ``produce --json`` (JSON lines), checking the summary at the end."""
    assert main(["produce", *argv, "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    *acks, last = lines
    assert last == {
        "summary": {
            "records": len(acks),
            "bytes": sum(int(str(a["bytes"])) for a in acks),
            "streams": len({a["stream_id"] for a in acks}),
            "closed": True,
        }
    }
    return acks


def test_produce_prints_acknowledged_offsets_and_appends_again_on_rerun(
    engine_args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    rows = run_produce(capsys, [*engine_args, "--streams", "2", "--count", "3", "--size", "50"])
    assert sorted((r["stream_id"], r["offset"]) for r in rows) == [(s, o) for s in (0, 1) for o in range(3)]
    assert all(r["bytes"] == 50 for r in rows)
    again = run_produce(capsys, [*engine_args, "--streams", "2", "--count", "1"])
    assert sorted((r["stream_id"], r["offset"]) for r in again) == [(0, 3), (1, 3)]
    streams = run_json(capsys, ["streams", *engine_args])
    assert [(s["stream_id"], s["start_offset"], s["end_offset"], s["state"]) for s in streams] == [
        (0, 0, 4, "CLOSED"),
        (1, 0, 4, "CLOSED"),
    ]
    assert [s["tags"] for s in streams] == ["name=produce-0", "name=produce-1"]


def test_produce_from_stdin_spreads_lines_over_the_streams(
    engine_args: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    stdin = io.TextIOWrapper(io.BytesIO(b"alpha\nbeta\n\ngamma\n"))
    monkeypatch.setattr("sys.stdin", stdin)
    rows = run_produce(capsys, [*engine_args, "--stdin", "--streams", "2"])
    assert [(r["stream_id"], r["offset"], r["bytes"]) for r in rows] == [(0, 0, 5), (1, 0, 4), (0, 1, 5)]
    fetched = run_json(capsys, ["fetch", *engine_args, "--stream", "0"])
    assert [r["payload"] for r in fetched] == ["alpha", "gamma"]


def test_fetch_prints_a_range_read_back_from_object_storage(
    engine_args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["produce", *engine_args, "--count", "20", "--size", "100"]) == 0
    capsys.readouterr()
    rows = run_json(capsys, ["fetch", *engine_args, "--stream", "0", "--start", "5", "--end", "9"])
    assert [r["offset"] for r in rows] == [5, 6, 7, 8]
    assert rows[0]["payload"] == preview(generated_payload(0, 5, 100))
    assert main(["fetch", *engine_args, "--stream", "0", "--start", "18"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["offset", "count", "bytes", "payload"]
    assert [line.split()[0] for line in table[1:]] == ["18", "19"]


def test_objects_lists_committed_objects_with_their_ranges(
    engine_args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["produce", *engine_args, "--streams", "2", "--count", "5"]) == 0
    capsys.readouterr()
    rows = run_json(capsys, ["objects", *engine_args])
    committed = [r for r in rows if r["state"] == "COMMITTED"]
    assert committed, rows
    ranges = " ".join(str(r["ranges"]) for r in committed)
    assert "0:[0,5)" in ranges
    assert "1:[0,5)" in ranges
    assert all(int(str(r["size_bytes"])) > 0 for r in committed)


def test_errors_print_one_line_and_exit_2(engine_args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fetch", *engine_args, "--stream", "42"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("s3stream fetch: error:")
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert main(["produce", *engine_args, "--streams", "0"]) == 2
    assert "--streams" in capsys.readouterr().err
    assert main(["produce", *engine_args, "--count", "2"]) == 0
    capsys.readouterr()
    assert main(["fetch", *engine_args, "--stream", "0", "--start", "1", "--end", "9"]) == 2
    assert "s3stream fetch: error:" in capsys.readouterr().err  # beyond the confirm offset


def test_bad_config_file_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('"s3.no.such.key" = 1\n')
    assert main(["streams", "--data-dir", str(tmp_path / "d"), "--config", str(bad)]) == 2
    assert "unknown config key" in capsys.readouterr().err


def test_demo_round_trips_through_object_storage(
    engine_args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", *engine_args]) == 0
    out = capsys.readouterr().out
    assert "demo OK" in out
    assert out.count("200/200 match") == 3
    assert "s3stream inspect object" in out
    assert "footer: index position" in out
