"""The attach command (``s3.wal.failover.attach.cmd``) run as a real shell command."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from s3stream.cluster.attach import attach_command, attach_wal, chosen_path
from s3stream.errors import InvalidArgumentError, UnavailableError


def test_placeholders_are_replaced_and_the_path_is_quoted() -> None:
    cmd = attach_command("attach --node {node_id} --wal {wal_path}", node_id=7, wal_path="/a b/wal")
    assert cmd == "attach --node 7 --wal '/a b/wal'"


def test_the_last_non_empty_stdout_line_is_the_path() -> None:
    assert chosen_path(b"attaching...\n/mnt/n7/wal\n\n  \n", "/rec") == "/mnt/n7/wal"
    assert chosen_path(b"\n \n", "/rec") == "/rec"


async def test_no_command_opens_the_recorded_path() -> None:
    assert await attach_wal("", node_id=1, wal_path="/data/n1/wal") == "/data/n1/wal"
    with pytest.raises(InvalidArgumentError):
        await attach_wal("  ", node_id=1, wal_path="")


async def test_a_script_copies_the_wal_and_names_the_copy(tmp_path: Path) -> None:
    wal = tmp_path / "n1" / "wal"
    wal.parent.mkdir()
    wal.write_bytes(b"wal bytes")
    target = tmp_path / "attached"
    script = tmp_path / "attach.sh"
    script.write_text(
        f'#!/bin/sh\nset -e\nmkdir -p {target}/$1\necho "copying $2"\ncp "$2" {target}/$1/wal\n'
        f"echo {target}/$1/wal\n"
    )
    script.chmod(0o755)
    path = await attach_wal(f"{script} {{node_id}} {{wal_path}}", node_id=1, wal_path=str(wal))
    assert path == str(target / "1" / "wal")
    assert Path(path).read_bytes() == b"wal bytes"


async def test_a_command_printing_nothing_keeps_the_recorded_path(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    path = await attach_wal(f"touch {marker}", node_id=3, wal_path="/data/n3/wal")
    assert path == "/data/n3/wal"
    assert marker.exists()


async def test_a_non_zero_exit_fails_the_attempt_with_its_stderr() -> None:
    with pytest.raises(UnavailableError, match=r"status 3.*volume busy"):
        await attach_wal("echo volume busy >&2; exit 3", node_id=2, wal_path="/w")


async def test_a_command_past_its_timeout_is_killed_with_its_children(tmp_path: Path) -> None:
    marker = tmp_path / "late"
    started = time.monotonic()
    with pytest.raises(UnavailableError, match="did not finish"):
        await attach_wal(f"(sleep 1; touch {marker}) & sleep 30", node_id=2, wal_path="/w", timeout_s=0.3)
    assert time.monotonic() - started < 5
    time.sleep(1.5)
    assert not marker.exists(), "the command's background child outlived the kill"
