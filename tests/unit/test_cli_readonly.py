"""The read commands (streams, objects, fetch) write nothing and work while a writer owns the data dir.

A real writer process holds the data dir open (its WAL locked, records acknowledged but not yet
uploaded) while the commands run; then, on the closed data dir, ``metadata.db`` and ``wal`` keep
their bytes and no stream's epoch moves.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from s3stream.cli import main
from s3stream.cli.fetch import preview

CONFIG = """
"s3.wal.capacity" = "16MiB"
"s3.wal.record.size.max" = "1MiB"
"s3.record.size.max" = "512KiB"
"s3.wal.cache.size" = "8MiB"
"s3.wal.upload.threshold" = "4MiB"
"s3.block.cache.size" = "4MiB"
"""

WRITER = textwrap.dedent(
    """
    import asyncio, sys
    from s3stream import assembly
    from s3stream.config import Config
    from s3stream.cli.streams import open_existing
    from s3stream.model import RecordBatch

    async def main(data_dir, config_path):
        client = await assembly.open_client(data_dir, config=Config.from_sources(config_path))
        stream = await open_existing(client, 0)
        for i in range(3):
            await stream.append(RecordBatch(b"live-%d" % i))
        print("ready", stream.next_offset, flush=True)
        await asyncio.to_thread(sys.stdin.read)  # hold the data dir until stdin closes
        await stream.close()
        await client.close()

    asyncio.run(main(sys.argv[1], sys.argv[2]))
    """
)


@pytest.fixture
def engine_args(tmp_path: Path) -> list[str]:
    config = tmp_path / "s3stream.toml"
    config.write_text(CONFIG)
    return ["--data-dir", str(tmp_path / "data"), "--config", str(config)]


def cli_json(argv: list[str]) -> list[dict[str, object]]:
    """Run the CLI in its own process (as a user would, next to the writer)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run(
        [sys.executable, "-m", "s3stream", *argv, "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    out: list[dict[str, object]] = json.loads(done.stdout)
    return out


@contextlib.contextmanager
def running_writer(engine_args: list[str]) -> Iterator[subprocess.Popen[str]]:
    """A process that appends 3 records to stream 0 (offsets 5..7, not uploaded) and holds the data
    dir open until the block ends."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, engine_args[1], engine_args[3]],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().split() == ["ready", "8"]
        yield proc
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_read_commands_show_a_live_writers_data(
    engine_args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["produce", *engine_args, "--count", "5", "--size", "20"]) == 0  # uploaded, closed
    capsys.readouterr()
    with running_writer(engine_args) as proc:
        assert proc.poll() is None  # the writer holds the data dir (its WAL is locked)
        streams = cli_json(["streams", *engine_args])
        assert [(s["stream_id"], s["end_offset"], s["uploaded_end"], s["state"]) for s in streams] == [
            (0, 8, 5, "OPENED")
        ]
        epoch = streams[0]["epoch"]
        objects = cli_json(["objects", *engine_args])
        assert "0:[0,5)" in " ".join(str(o["ranges"]) for o in objects if o["state"] == "COMMITTED")
        rows = cli_json(["fetch", *engine_args, "--stream", "0"])
        assert [r["offset"] for r in rows] == list(range(8))
        assert [r["payload"] for r in rows[5:]] == [preview(b"live-%d" % i) for i in range(3)]
        assert cli_json(["streams", *engine_args])[0]["epoch"] == epoch  # fetch opened no stream


def test_read_commands_change_no_byte_of_a_closed_data_dir(
    engine_args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["produce", *engine_args, "--streams", "2", "--count", "4"]) == 0
    capsys.readouterr()
    data = Path(engine_args[1])
    before = {name: digest(data / name) for name in ("metadata.db", "wal")}
    files = sorted(p.relative_to(data) for p in data.rglob("*"))
    epochs = [s["epoch"] for s in cli_json(["streams", *engine_args])]
    assert len(cli_json(["fetch", *engine_args, "--stream", "1"])) == 4
    assert cli_json(["objects", *engine_args])
    assert [s["epoch"] for s in cli_json(["streams", *engine_args])] == epochs
    assert {name: digest(data / name) for name in ("metadata.db", "wal")} == before
    assert sorted(p.relative_to(data) for p in data.rglob("*")) == files  # not even a -shm file


def test_an_unreadable_wal_is_a_note_and_the_uploaded_records_still_show(
    engine_args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["produce", *engine_args, "--count", "2"]) == 0
    capsys.readouterr()
    wal = Path(engine_args[1]) / "wal"
    with wal.open("r+b") as f:
        f.write(b"\xff" * 8192)  # both header slots damaged
    assert main(["fetch", *engine_args, "--stream", "0", "--json"]) == 0
    captured = capsys.readouterr()
    assert [row["offset"] for row in json.loads(captured.out)] == [0, 1]
    assert captured.err.startswith("note: the WAL ")
    assert "records not yet uploaded are not shown" in captured.err
