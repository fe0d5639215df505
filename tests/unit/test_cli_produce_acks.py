"""``s3stream produce`` prints each acknowledgement as it comes, so a failure later loses no knowledge.

The user must be able to tell exactly which records are stored whatever happens after an append was
acknowledged: a failed close, a failed append, or the process being killed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import TextIO

import pytest

from s3stream.cli import main
from s3stream.cli.produce import AckPrinter
from s3stream.engine.client import Stream
from s3stream.errors import UnavailableError

ROOT = Path(__file__).resolve().parents[2]
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


class Recorder:
    """A stdout that records what was written and where it was flushed."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def write(self, text: str) -> int:
        self.events.append(text)
        return len(text)

    def flush(self) -> None:
        self.events.append("<flush>")


def test_every_line_is_flushed_as_it_is_printed() -> None:
    out = Recorder()
    printer = AckPrinter(out, as_json=True)  # type: ignore[arg-type]
    stream = SimpleNamespace(stream_id=3)
    printer.ack(stream, 7, b"x" * 100)  # type: ignore[arg-type]
    printer.ack(stream, 8, b"y" * 50)  # type: ignore[arg-type]
    printer.summary(closed=True)
    assert out.events == [
        '{"stream_id": 3, "offset": 7, "bytes": 100}\n',
        "<flush>",
        '{"stream_id": 3, "offset": 8, "bytes": 50}\n',
        "<flush>",
        '{"summary": {"records": 2, "bytes": 150, "streams": 1, "closed": true}}\n',
        "<flush>",
    ]


def test_table_output_has_a_header_a_line_per_ack_and_a_summary(
    engine_args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["produce", *engine_args, "--streams", "2", "--count", "2", "--size", "10"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["stream_id", "offset", "bytes"]
    assert sorted(tuple(map(int, line.split())) for line in lines[1:-1]) == [
        (0, 0, 10),
        (0, 1, 10),
        (1, 0, 10),
        (1, 1, 10),
    ]
    assert lines[-1] == "acknowledged 4 records (40 bytes) in 2 streams; streams closed, data uploaded"


def test_a_failed_close_still_shows_every_acknowledged_record_and_says_not_to_write_them_again(
    engine_args: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    async def failing_close(self: Stream) -> None:
        raise UnavailableError("object storage does not answer")

    monkeypatch.setattr(Stream, "close", failing_close)
    assert main(["produce", *engine_args, "--count", "5", "--json"]) == 2
    captured = capsys.readouterr()
    lines = [json.loads(line) for line in captured.out.splitlines()]
    assert [(row["stream_id"], row["offset"]) for row in lines[:-1]] == [(0, i) for i in range(5)]
    assert lines[-1] == {"summary": {"records": 5, "bytes": 500, "streams": 1, "closed": False}}
    assert "the 5 records printed before this error were acknowledged and are durable" in captured.err
    assert "do not write them again" in captured.err
    assert "s3stream produce: error: object storage does not answer" in captured.err

    monkeypatch.undo()
    assert main(["fetch", *engine_args, "--stream", "0", "--json"]) == 0
    fetched = json.loads(capsys.readouterr().out)
    assert [row["offset"] for row in fetched] == list(range(5)), "what was printed is stored"


def _read_line(out: TextIO) -> str:
    line = out.readline()
    assert line, "produce exited before printing an acknowledgement"
    return line


def test_records_printed_before_a_kill_9_are_all_stored(engine_args: list[str], tmp_path: Path) -> None:
    """A real process killed while it appends: every acknowledgement it printed is a stored record."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [
        sys.executable,
        "-m",
        "s3stream",
        "produce",
        *engine_args,
        "--count",
        "200000",
        "--size",
        "64",
        "--json",
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    assert proc.stdout is not None
    printed = [json.loads(_read_line(proc.stdout)) for _ in range(300)]
    assert proc.poll() is None, "still appending: the lines came as the records were acknowledged"
    proc.send_signal(signal.SIGKILL)
    rest = proc.stdout.read()
    proc.wait()
    printed += [json.loads(line) for line in rest.splitlines() if line.endswith("}")]
    acked = [row["offset"] for row in printed if "offset" in row]
    assert acked == list(range(len(acked)))

    fetch = [sys.executable, "-m", "s3stream", "fetch", *engine_args, "--stream", "0", "--json"]
    stored = json.loads(
        subprocess.run(fetch, capture_output=True, text=True, env=env, cwd=ROOT, check=True).stdout
    )
    assert [row["offset"] for row in stored][: len(acked)] == acked
