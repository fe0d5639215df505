"""scripts/ceph-rgw: env output, status against the running gateway, and data that survives a restart.

The restart test bootstraps a second, private cluster (own data dir and ports) so it never disturbs the
shared one other tests are using; it takes about a minute, so it only runs with
S3STREAM_TEST_CEPH_RESTART=1.
"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiobotocore.session import get_session

from tests.support.s3 import S3TestServer

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "ceph-rgw"
RUN_TIMEOUT_S = 240


def run_script(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        env=env,
        check=False,
    )


def parse_exports(text: str) -> dict[str, str]:
    exports: dict[str, str] = {}
    for line in text.splitlines():
        words = shlex.split(line)
        assert words[0] == "export", line
        for word in words[1:]:
            name, _, value = word.partition("=")
            exports[name] = value
    return exports


def test_env_prints_every_test_variable_as_an_export() -> None:
    done = run_script("env")
    assert done.returncode == 0, done.stderr
    exports = parse_exports(done.stdout)
    for name in ("ENDPOINT", "ACCESS_KEY", "SECRET_KEY", "BUCKET", "REGION"):
        assert exports[f"S3STREAM_TEST_S3_{name}"], name
    assert exports["S3STREAM_TEST_S3_BUCKET"] == "s3stream-test"
    assert exports["S3STREAM_TEST_S3_REGION"] == "us-east-1"
    assert exports["S3STREAM_TEST_S3_ENDPOINT"].startswith("http://127.0.0.1:")
    assert exports["AWS_ACCESS_KEY_ID"] == exports["S3STREAM_TEST_S3_ACCESS_KEY"]


def test_status_reports_a_running_gateway(s3_server: S3TestServer) -> None:
    exports = parse_exports(run_script("env").stdout)
    if s3_server.endpoint != exports["S3STREAM_TEST_S3_ENDPOINT"]:
        pytest.skip(f"the S3 server under test ({s3_server.endpoint}) is not this script's Ceph RGW")
    assert s3_server.access_key == exports["S3STREAM_TEST_S3_ACCESS_KEY"]
    done = run_script("status")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "answers" in done.stdout
    assert "not running" not in done.stdout
    for daemon in ("mon.a", "osd.0", "client.rgw.a"):
        assert f"{daemon} " in done.stdout
    assert re.search(
        r"^osd\.0 fill +[0-9.]+% \(raw used [0-9.]+ GiB, available [0-9.]+ GiB of", done.stdout, re.M
    )
    bucket_line = r"^bucket +s3stream-test: [0-9]+ objects, [0-9.]+ GiB; [0-9]+ unfinished multipart uploads$"
    assert re.search(bucket_line, done.stdout, re.M)


def test_fill_prints_the_osd_statfs_as_name_value_lines(s3_server: S3TestServer) -> None:
    if s3_server.endpoint != parse_exports(run_script("env").stdout)["S3STREAM_TEST_S3_ENDPOINT"]:
        pytest.skip(f"the S3 server under test ({s3_server.endpoint}) is not this script's Ceph RGW")
    done = run_script("fill")
    assert done.returncode == 0, done.stderr
    fill = dict(line.split("=", 1) for line in done.stdout.split())
    used, avail, total = (int(fill[f"osd_{name}_bytes"]) for name in ("used", "avail", "total"))
    assert 0 < used < total
    assert 0 < avail <= total - used
    assert float(fill["osd_fill_ratio"]) == pytest.approx(used / total, abs=1e-4)
    assert 0 < float(fill["full_ratio"]) <= 1


def test_unknown_command_is_a_usage_error() -> None:
    done = run_script("bogus")
    assert done.returncode == 2
    assert "usage:" in done.stderr


def test_reset_refuses_to_wipe_a_directory_it_did_not_create(tmp_path: Path) -> None:
    data_dir = tmp_path / "not-ceph"
    data_dir.mkdir()
    (data_dir / "precious.txt").write_text("keep me")
    (data_dir / "ceph.conf").write_text("[global]\nfsid = 1\n")  # a ceph.conf, but not one of ours
    env = dict(os.environ, S3STREAM_CEPH_DIR=str(data_dir), S3STREAM_CEPH_RGW_PORT=str(free_port()))
    done = run_script("reset", env=env)
    assert done.returncode == 1
    assert "refusing to wipe" in done.stderr
    assert sorted(p.name for p in data_dir.iterdir()) == ["ceph.conf", "precious.txt"]


# --- restart: a private cluster -------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
def private_cluster(tmp_path: Path) -> Iterator[dict[str, str]]:
    if os.environ.get("S3STREAM_TEST_CEPH_RESTART") != "1":
        pytest.skip("set S3STREAM_TEST_CEPH_RESTART=1 to bootstrap and restart a private cluster (~1 min)")
    env = dict(os.environ)
    env.update(
        S3STREAM_CEPH_DIR=str(tmp_path / "ceph"),
        S3STREAM_CEPH_RGW_PORT=str(free_port()),
        S3STREAM_CEPH_MON_PORT=str(free_port()),
        S3STREAM_CEPH_BLOCK_SIZE="4G",
    )
    try:
        yield env
    finally:
        run_script("stop", env=env)


def s3_client(exports: dict[str, str]) -> Any:
    return get_session().create_client(
        "s3",
        endpoint_url=exports["S3STREAM_TEST_S3_ENDPOINT"],
        region_name=exports["S3STREAM_TEST_S3_REGION"],
        aws_access_key_id=exports["S3STREAM_TEST_S3_ACCESS_KEY"],
        aws_secret_access_key=exports["S3STREAM_TEST_S3_SECRET_KEY"],
    )


async def put_then_get(exports: dict[str, str], key: str, body: bytes | None) -> bytes:
    async with s3_client(exports) as client:
        bucket = exports["S3STREAM_TEST_S3_BUCKET"]
        if body is not None:
            await client.put_object(Bucket=bucket, Key=key, Body=body)
        response = await client.get_object(Bucket=bucket, Key=key)
        async with response["Body"] as stream:
            data: bytes = await stream.read()
            return data


def test_data_survives_stop_start_and_a_crash(private_cluster: dict[str, str]) -> None:
    env = private_cluster
    body = os.urandom(3 * 1024 * 1024 + 17)

    done = run_script("start", env=env)
    assert done.returncode == 0, done.stderr
    exports = parse_exports(run_script("env", env=env).stdout)
    assert asyncio.run(put_then_get(exports, "survivor", body)) == body

    again = run_script("start", env=env)
    assert again.returncode == 0, again.stderr
    assert "starting" not in again.stderr, "start on a running cluster must not start anything"

    stopped = run_script("stop", env=env)
    assert stopped.returncode == 0, stopped.stderr
    assert run_script("status", env=env).returncode != 0

    done = run_script("start", env=env)
    assert done.returncode == 0, done.stderr
    assert asyncio.run(put_then_get(exports, "survivor", None)) == body

    # A crash: every daemon killed with SIGKILL, pid files left behind.
    run_dir = Path(env["S3STREAM_CEPH_DIR"]) / "run"
    for daemon in ("client.rgw.a", "osd.0", "mon.a"):
        os.kill(int((run_dir / f"{daemon}.pid").read_text()), signal.SIGKILL)
    done = run_script("start", env=env)
    assert done.returncode == 0, done.stderr
    assert "stale pid file" in done.stderr
    assert asyncio.run(put_then_get(exports, "survivor", None)) == body
    assert run_script("status", env=env).returncode == 0


async def keys_in_bucket(exports: dict[str, str]) -> list[str]:
    async with s3_client(exports) as client:
        listed = await client.list_objects_v2(Bucket=exports["S3STREAM_TEST_S3_BUCKET"])
        return [item["Key"] for item in listed.get("Contents", [])]


def test_reset_wipes_the_objects_and_keeps_the_ports_and_size(private_cluster: dict[str, str]) -> None:
    env = private_cluster
    data_dir = Path(env["S3STREAM_CEPH_DIR"])
    done = run_script("start", env=env)
    assert done.returncode == 0, done.stderr
    (data_dir / "not-ours.txt").write_text("a file of someone else's in the data directory")
    exports = parse_exports(run_script("env", env=env).stdout)
    asyncio.run(put_then_get(exports, "doomed", b"x" * 1024))
    assert asyncio.run(keys_in_bucket(exports)) == ["doomed"]

    # status warns above S3STREAM_CEPH_FILL_WARN_PCT (a fresh OSD is a few per cent full)
    warned = run_script("status", env=dict(env, S3STREAM_CEPH_FILL_WARN_PCT="0.1"))
    assert warned.returncode == 0, warned.stdout + warned.stderr
    assert "WARNING: osd.0 is" in warned.stderr
    assert "scripts/ceph-rgw reset" in warned.stderr
    assert "WARNING" not in run_script("status", env=env).stderr

    # without S3STREAM_CEPH_MON_PORT / _BLOCK_SIZE the new cluster keeps the old one's
    reset_env = {
        k: v for k, v in env.items() if k not in ("S3STREAM_CEPH_MON_PORT", "S3STREAM_CEPH_BLOCK_SIZE")
    }
    fsid = (data_dir / "fsid").read_text()
    done = run_script("reset", env=reset_env)
    assert done.returncode == 0, done.stderr
    assert "bootstrapping a new cluster" in done.stderr
    assert (data_dir / "fsid").read_text() != fsid
    assert (data_dir / "mon_port").read_text().strip() == env["S3STREAM_CEPH_MON_PORT"]
    assert "bluestore_block_size = 4G" in (data_dir / "ceph.conf").read_text()
    assert (data_dir / "not-ours.txt").exists()
    assert asyncio.run(keys_in_bucket(exports)) == []
    assert run_script("status", env=env).returncode == 0
