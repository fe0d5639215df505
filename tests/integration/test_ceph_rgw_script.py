"""scripts/ceph-rgw: env output, status against the running gateway, and data that survives a restart.

The restart test bootstraps a second, private cluster (own data dir and ports) so it never disturbs the
shared one other tests are using; it takes about a minute, so it only runs with
S3STREAM_TEST_CEPH_RESTART=1.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiobotocore.session import get_session

from tests.conftest import S3TestServer

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


def test_unknown_command_is_a_usage_error() -> None:
    done = run_script("bogus")
    assert done.returncode == 2
    assert "usage:" in done.stderr


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


async def put_then_get(exports: dict[str, str], key: str, body: bytes | None) -> bytes:
    async with get_session().create_client(
        "s3",
        endpoint_url=exports["S3STREAM_TEST_S3_ENDPOINT"],
        region_name=exports["S3STREAM_TEST_S3_REGION"],
        aws_access_key_id=exports["S3STREAM_TEST_S3_ACCESS_KEY"],
        aws_secret_access_key=exports["S3STREAM_TEST_S3_SECRET_KEY"],
    ) as client:
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
