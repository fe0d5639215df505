"""The engine subcommands with objects on a real S3 server (Ceph RGW) through --bucket-uri."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from s3stream._loop import run
from s3stream.cli import main
from tests.support.configs import SMALL_TOML
from tests.support.s3 import S3TestServer

pytestmark = pytest.mark.integration


async def _keys(server: S3TestServer, prefix: str) -> list[str]:
    storage = server.storage(prefix)
    try:
        keys = [info.key async for info in storage.list("")]
        await storage.delete(keys)
        return keys
    finally:
        await storage.close()


def test_demo_and_fetch_with_objects_on_s3(
    s3_server: S3TestServer, s3_prefix: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "s3stream.toml"
    config.write_text(SMALL_TOML)
    args = [
        "--data-dir",
        str(tmp_path / "data"),
        "--config",
        str(config),
        "--bucket-uri",
        s3_server.uri(s3_prefix),
    ]
    assert main(["demo", *args]) == 0
    out = capsys.readouterr().out
    assert "demo OK" in out
    assert main(["fetch", *args, "--stream", "1", "--start", "10", "--end", "12", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["offset"] for r in rows] == [10, 11]
    # The data dir recorded its storage: without --bucket-uri the read commands read the same bucket
    # (keys from the environment) instead of the empty local objects/ folder.
    assert main(["fetch", *args[:4], "--stream", "1", "--start", "10", "--end", "12", "--json"]) == 0
    assert [r["offset"] for r in json.loads(capsys.readouterr().out)] == [10, 11]
    assert not (tmp_path / "data" / "objects").exists()
    assert main(["objects", *args, "--json"]) == 0
    objects = json.loads(capsys.readouterr().out)
    committed = {o["key"] for o in objects if o["state"] == "COMMITTED"}
    stored = run(_keys(s3_server, s3_prefix))  # also cleans up
    assert committed
    assert committed <= set(stored)
