"""The engine subcommands (produce, fetch, streams, objects, demo) on a real embedded data dir."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from s3stream.cli import main
from s3stream.cli.fetch import preview
from s3stream.cli.produce import generated_payload
from s3stream.engine.client import Stream
from s3stream.errors import UnavailableError
from tests.support.configs import cli_data_dir_args


@pytest.fixture
def engine_args(tmp_path: Path) -> list[str]:
    return cli_data_dir_args(tmp_path)


def run_json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> list[dict[str, object]]:
    assert main([*argv, "--json"]) == 0
    out: list[dict[str, object]] = json.loads(capsys.readouterr().out)
    return out


def produce_json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> list[dict[str, object]]:
    """The ack lines of ``produce --json`` (JSON lines), checked against its summary line."""
    assert main([*argv, "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    *acks, last = lines
    assert last["summary"]["records"] == len(acks)
    assert last["summary"]["bytes"] == sum(a["bytes"] for a in acks)
    return acks


def test_produce_prints_acknowledged_offsets_and_appends_again_on_rerun(
    engine_args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    rows = produce_json(capsys, ["produce", *engine_args, "--streams", "2", "--count", "3", "--size", "50"])
    assert sorted((r["stream_id"], r["offset"]) for r in rows) == [(s, o) for s in (0, 1) for o in range(3)]
    assert all(r["bytes"] == 50 for r in rows)
    again = produce_json(capsys, ["produce", *engine_args, "--streams", "2", "--count", "1"])
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
    rows = produce_json(capsys, ["produce", *engine_args, "--stdin", "--streams", "2"])
    assert sorted((r["stream_id"], r["offset"], r["bytes"]) for r in rows) == [
        (0, 0, 5),
        (0, 1, 5),
        (1, 0, 4),
    ]
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


def test_produce_prints_each_ack_as_it_comes_then_a_summary(engine_args: list[str]) -> None:
    """A real process: the first ack line is readable while the process still appends."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    argv = ["produce", *engine_args, "--streams", "2", "--count", "2000", "--size", "100", "--json"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "s3stream", *argv], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())
        assert proc.poll() is None  # still running: the line came with its ack, not at the end
        assert set(first) == {"stream_id", "offset", "bytes"}
        rest = [json.loads(line) for line in proc.stdout]
    finally:
        assert proc.wait(timeout=120) == 0
    *acks, summary = [first, *rest]
    assert summary == {"summary": {"records": 4000, "bytes": 400_000, "next_offsets": {"0": 2000, "1": 2000}}}
    for stream_id in (0, 1):
        assert [a["offset"] for a in acks if a["stream_id"] == stream_id] == list(range(2000))


def test_produce_table_prints_a_header_one_line_per_ack_and_a_summary(
    engine_args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["produce", *engine_args, "--count", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["stream_id", "offset", "bytes"]
    assert [line.split() for line in lines[1:4]] == [["0", str(i), "100"] for i in range(3)]
    assert lines[4] == "acknowledged 3 records (300 bytes); streams closed, next offsets 0:3"


def test_produce_whose_close_fails_still_shows_what_was_acknowledged(
    engine_args: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    async def failing_close(self: Stream) -> None:
        raise UnavailableError("object storage down")

    monkeypatch.setattr(Stream, "close", failing_close)
    assert main(["produce", *engine_args, "--count", "2", "--json"]) == 2
    captured = capsys.readouterr()
    assert [json.loads(line)["offset"] for line in captured.out.splitlines()] == [0, 1]  # no summary
    err = captured.err.splitlines()
    assert err[0] == "s3stream produce: the 2 records acknowledged above are durable: do not write them again"
    assert err[1].startswith("s3stream produce: error:")
    assert "object storage down" in err[1]
