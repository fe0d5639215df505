"""``--metadata-url`` on every command, with SQLite metadata: it picks the store, overrides the config,
lets read commands run without a data dir, leaves the store's bytes alone, and a bad URL is one line
on stderr with exit code 2 and no password.

PostgreSQL: ``tests/integration/test_cli_metadata_postgres.py``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

from s3stream.cli import build_parser, main
from s3stream.cli.fetch import preview
from s3stream.cli.produce import generated_payload
from tests.support.configs import SMALL_TOML, cli_data_dir_args

SECRET = "hunter2-not-for-output"
READ_COMMANDS = (["streams"], ["objects"], ["fetch", "--stream", "0"], ["nodes"], ["buckets"])


def leaf_commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every runnable subcommand path (``("inspect", "object")`` ...)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [prefix]
    return [
        path
        for a in subs
        for name, child in a.choices.items()
        for path in leaf_commands(child, (*prefix, name))
    ]


def required_args(path: tuple[str, ...]) -> list[str]:
    """Enough arguments for the parser to accept the subcommand."""
    return {
        ("buckets", "set-weights"): ["0:1,1:1"],
        ("fetch",): ["--stream", "0"],
        ("inspect", "object"): ["x"],
        ("restore",): ["--bucket-uri", "file:///x", "--data-dir", "d"],
        ("reassign",): ["--stream", "0", "--to-node", "1"],
        ("top",): ["127.0.0.1:9464"],
    }.get(path, [])


class Produced(NamedTuple):
    args: list[str]
    db: Path
    url: str


@pytest.fixture
def produced(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Produced:
    """A closed data dir whose objects are in a ``file://`` bucket (recorded in its metadata): 2
    streams of 3 generated records of 30 bytes."""
    args = cli_data_dir_args(tmp_path)
    bucket = f"file://{tmp_path / 'bucket'}"
    assert (
        main(["produce", *args, "--bucket-uri", bucket, "--streams", "2", "--count", "3", "--size", "30"])
        == 0
    )
    capsys.readouterr()
    db = tmp_path / "data" / "metadata.db"
    return Produced(args, db, f"sqlite://{db}")


def run_json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> list[dict[str, object]]:
    assert main([*argv, "--json"]) == 0
    out: list[dict[str, object]] = json.loads(capsys.readouterr().out)
    return out


def test_every_command_takes_metadata_url() -> None:
    parser = build_parser()
    paths = leaf_commands(parser)
    assert {"streams", "objects", "fetch", "nodes", "produce", "compact", "demo"} <= {p[0] for p in paths}
    for path in paths:
        args = parser.parse_args([*path, *required_args(path), "--metadata-url", "sqlite:///x/m.db"])
        assert args.metadata_url == "sqlite:///x/m.db", path


def test_read_commands_read_the_named_store_without_a_data_dir(
    produced: Produced, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nowhere = ["--data-dir", str(tmp_path / "no-such-dir"), "--metadata-url", produced.url]
    streams = run_json(["streams", *nowhere], capsys)
    assert [(s["stream_id"], s["end_offset"], s["owner"]) for s in streams] == [(0, 3, 0), (1, 3, 0)]
    objects = run_json(["objects", *nowhere], capsys)
    assert "1:[0,3)" in " ".join(str(o["ranges"]) for o in objects)
    rows = run_json(["fetch", *nowhere, "--stream", "1"], capsys)  # objects from the recorded bucket
    assert [r["payload"] for r in rows] == [preview(generated_payload(1, i, 30)) for i in range(3)]
    assert [n["node_id"] for n in run_json(["nodes", *nowhere], capsys)] == [0]
    assert not (tmp_path / "no-such-dir").exists()


def test_metadata_url_overrides_the_config_file_and_the_environment(
    produced: Produced,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    config = tmp_path / "other.toml"
    config.write_text(SMALL_TOML + f'"s3.metadata.url" = "sqlite://{elsewhere}/config.db"\n')
    base = ["--data-dir", str(tmp_path / "no-such-dir"), "--config", str(config)]
    assert main(["streams", *base]) == 2  # the config's store does not exist
    assert "config.db" in capsys.readouterr().err
    assert len(run_json(["streams", *base, "--metadata-url", produced.url], capsys)) == 2
    monkeypatch.setenv("S3STREAM_S3_METADATA_URL", f"sqlite://{elsewhere}/env.db")
    assert main(["streams", *base]) == 2
    assert "env.db" in capsys.readouterr().err
    assert len(run_json(["streams", *base, "--metadata-url", produced.url], capsys)) == 2
    assert sorted(os.listdir(elsewhere)) == []  # nothing was created at the URLs not used


def test_read_commands_leave_the_sqlite_store_unchanged(
    produced: Produced, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = produced.db
    before = hashlib.sha256(db.read_bytes()).hexdigest(), db.stat().st_mtime_ns
    files = sorted(os.listdir(db.parent))
    for command in READ_COMMANDS:
        run_json([*command, "--data-dir", str(tmp_path / "none"), "--metadata-url", produced.url], capsys)
        run_json([*command, *produced.args, "--metadata-url", produced.url], capsys)
    assert (hashlib.sha256(db.read_bytes()).hexdigest(), db.stat().st_mtime_ns) == before
    assert sorted(os.listdir(db.parent)) == files  # no -wal/-shm/journal file either


@pytest.mark.parametrize(
    "url",
    [
        f"mysql://admin:{SECRET}@db.example/s3",
        f"postgresql://admin:{SECRET}@db.example",
        f"postgresql://admin:{SECRET}@db.example:notaport/s3",
        "no-scheme-at-all",
        "sqlite:///",
    ],
)
def test_a_bad_metadata_url_is_one_line_and_exit_2_for_every_command(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = build_parser()
    for path in leaf_commands(parser):
        argv = [*path, *required_args(path), *cli_data_dir_args(tmp_path), "--metadata-url", url]
        if path in (("inspect", "object"), ("top",)):  # no data dir
            argv = [*path, *required_args(path), "--metadata-url", url]
        assert main(argv) == 2, path
        captured = capsys.readouterr()
        assert captured.out == "", path
        assert captured.err.count("\n") == 1, (path, captured.err)
        assert "metadata URL" in captured.err, (path, captured.err)
        assert SECRET not in captured.err, path
    assert not (tmp_path / "data").exists()  # no command created its data dir


def test_a_bad_metadata_url_prints_no_traceback_from_a_real_process(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run(
        [sys.executable, "-m", "s3stream", "produce", *cli_data_dir_args(tmp_path), "--metadata-url",
         f"postgresql://admin:{SECRET}@db.example"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.startswith("s3stream produce: error: metadata URL")
    assert done.stderr.count("\n") == 1
    assert "Traceback" not in done.stderr
    assert SECRET not in done.stderr + done.stdout


def test_write_commands_keep_their_metadata_at_the_url(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shared = f"sqlite://{tmp_path / 'shared.db'}"
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    args_one = [*cli_data_dir_args(one), "--metadata-url", shared]
    config_two = two / "s3stream.toml"
    config_two.write_text(SMALL_TOML + '"s3.node.id" = 2\n')
    args_two = ["--data-dir", str(two / "data"), "--config", str(config_two), "--metadata-url", shared]
    assert main(["produce", *args_one, "--count", "3"]) == 0
    assert main(["produce", *args_two, "--count", "2", "--name", "two"]) == 0
    assert main(["compact", *args_one]) == 0
    capsys.readouterr()
    streams = run_json(["streams", "--data-dir", str(tmp_path / "none"), "--metadata-url", shared], capsys)
    assert [(s["stream_id"], s["end_offset"], s["owner"]) for s in streams] == [(0, 3, 0), (1, 2, 2)]
    nodes = run_json(["nodes", "--data-dir", str(tmp_path / "none"), "--metadata-url", shared], capsys)
    assert [(n["node_id"], n["epoch"]) for n in nodes] == [(0, 2), (2, 1)]  # compact opened node 0 again
    for data in (one / "data", two / "data"):
        assert not (data / "metadata.db").exists()  # the metadata is at the URL only
