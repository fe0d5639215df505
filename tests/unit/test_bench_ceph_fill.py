"""The harness's check of the local Ceph RGW's OSD fill before a run (with a stand-in for scripts/ceph-rgw)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from benchmarks import harness
from benchmarks.core import S3Target

OURS = "http://127.0.0.1:9"
"""Nothing listens there: a workload or bucket check that ran anyway fails at once."""
GIB = 1 << 30


def fake_script(
    tmp_path: Path, *, endpoint: str = OURS, ratio: float | None = 0.5, full: float = 0.95
) -> Path:
    """A script answering ``env`` with ``endpoint`` and ``fill`` with ``ratio`` (exit 1 if None)."""
    total = 20 * GIB
    used = int(total * ratio) if ratio is not None else 0
    fill = (
        f"echo osd_used_bytes={used}; echo osd_avail_bytes={total - used}; echo osd_total_bytes={total}; "
        f"echo osd_fill_ratio={ratio}; echo full_ratio={full}"
        if ratio is not None
        else "echo 'the fill of osd.0 is unknown' >&2; exit 1"
    )
    script = tmp_path / "ceph-rgw"
    script.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        f"  env) echo export S3STREAM_TEST_S3_ENDPOINT={endpoint}; echo export S3STREAM_TEST_S3_BUCKET=b ;;\n"
        f"  fill) {fill} ;;\n"
        "  *) exit 2 ;;\n"
        "esac\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def target(endpoint: str = OURS) -> S3Target:
    return S3Target(endpoint=endpoint, access_key="a", secret_key="s", bucket="b")


def test_a_nearly_full_local_ceph_osd_is_warned_about_loudly_and_noted(tmp_path: Path) -> None:
    logged: list[str] = []
    note = harness.check_ceph_fill(target(), logged.append, script=fake_script(tmp_path, ratio=0.85))
    assert note is not None
    assert "85.0% full" in note
    assert len(logged) == 1
    assert "WARNING" in logged[0]
    assert "scripts/ceph-rgw reset" in logged[0]


def test_a_full_local_ceph_osd_stops_the_run_with_a_clear_message(tmp_path: Path) -> None:
    with pytest.raises(
        harness.UsageError, match=r"96\.0% full .*refusing to run.*PUT waits until it times out"
    ):
        harness.check_ceph_fill(target(), print, script=fake_script(tmp_path, ratio=0.96))


def test_cephs_own_full_ratio_stops_the_run_when_it_is_lower(tmp_path: Path) -> None:
    with pytest.raises(harness.UsageError, match="refusing to run"):
        harness.check_ceph_fill(target(), print, script=fake_script(tmp_path, ratio=0.91, full=0.9))


def test_a_comfortably_empty_osd_says_nothing(tmp_path: Path) -> None:
    logged: list[str] = []
    assert harness.check_ceph_fill(target(), logged.append, script=fake_script(tmp_path, ratio=0.3)) is None
    assert logged == []


def test_a_remote_endpoint_is_not_checked(tmp_path: Path) -> None:
    script = fake_script(tmp_path, ratio=0.99)
    assert harness.check_ceph_fill(target("http://minio.example:9000"), print, script=script) is None


def test_an_unreadable_fill_of_the_local_ceph_is_a_warning_not_a_failure(tmp_path: Path) -> None:
    logged: list[str] = []
    note = harness.check_ceph_fill(
        target(OURS + "/"), logged.append, script=fake_script(tmp_path, ratio=None)
    )
    assert note is not None
    assert "could not read the fill" in note
    assert logged == [f"warning: {note}"]


def test_a_full_local_ceph_makes_the_command_line_a_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(harness, "CEPH_SCRIPT", fake_script(tmp_path, ratio=0.97))
    flags = ["--target", "s3", "--endpoint", OURS, "--access-key", "a", "--secret-key", "s"]

    async def never(ctx: object) -> list[object]:
        raise AssertionError("a workload ran against a full OSD")

    code = harness.main(["never", *flags, "--out", str(tmp_path / "out")], workloads={"never": never})  # type: ignore[dict-item]
    assert code == 2
    assert "refusing to run" in capsys.readouterr().err
