"""``s3stream buckets`` and ``buckets set-weights`` on real metadata (SQLite, PostgreSQL) and real
buckets (two prefixes of the Ceph RGW test bucket, or two folders).

``buckets`` reads only (the data dir's ``metadata.db`` is byte for byte the same after it), shows no
credential, and its objects and bytes are what the buckets hold; ``set-weights`` checks the weights
against the recorded bucket ids and a running node applies them without a restart.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from benchmarks.fault_proxy import FaultProxy
from s3stream import assembly
from s3stream.buckets.monitor import WEIGHTS_KEY
from s3stream.buckets.storage import MultiBucketStorage
from s3stream.buckets.strategy import Sharding
from s3stream.cli import main
from s3stream.errors import S3StreamError
from s3stream.metadata.base import ObjectState
from s3stream.metadata.url import open_metadata_store
from s3stream.model import RecordBatch
from s3stream.objectformat import parse_object_key
from tests.support.configs import small_config
from tests.support.fault_proxy import proxied
from tests.support.s3 import S3TestServer

WEIGHTS_APPLIED_S_MAX = 5.0
REPORT_WAIT_S_MAX = 30.0
"""Nodes publish their bucket figures every 5 s; a blackholed bucket needs 3 timeouts to be unhealthy."""


def s3_list(server: S3TestServer, prefix: str) -> str:
    return ",".join(server.uri(f"{prefix}{name}/").replace("0@", f"{i}@", 1) for i, name in enumerate("ab"))


def file_list(root: Path) -> str:
    return f"0@file://{root / 'a'},1@file://{root / 'b'}"


def _is_object_key(key: str) -> bool:
    try:
        parse_object_key(key)
    except S3StreamError:
        return False
    return True


def run_json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> list[dict[str, object]]:
    assert main([*argv, "--json"]) == 0
    out: list[dict[str, object]] = json.loads(capsys.readouterr().out)
    return out


def produce(data_dir: Path, bucket_list: str, *extra: str, run: int = 0) -> None:
    """One produce run: one new stream, one object uploaded at its close."""
    argv = [
        "produce",
        "--data-dir",
        str(data_dir),
        "--bucket-uri",
        bucket_list,
        *extra,
        "--name",
        f"run{run}",
    ]
    assert main([*argv, "--streams", "1", "--count", "20", "--size", "200"]) == 0


def test_buckets_shows_what_each_rgw_bucket_holds_reads_only_and_no_credentials(
    s3_server: S3TestServer, s3_prefix: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data_dir = tmp_path / "data"
    bucket_list = s3_list(s3_server, s3_prefix)
    produce(data_dir, bucket_list, run=0)  # round robin: a process's first object goes to bucket 0
    drain_0 = ("-c", "s3.data.buckets.strategy=sharding", "-c", "s3.data.buckets.weights=0:0,1:1")
    produce(data_dir, bucket_list, *drain_0, run=1)
    produce(data_dir, bucket_list, run=2)
    capsys.readouterr()
    db = data_dir / "metadata.db"
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    rows = run_json(capsys, ["buckets", "--data-dir", str(data_dir)])
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before
    assert [r["bucket_id"] for r in rows] == [0, 1]
    text = json.dumps(rows)
    for secret in (s3_server.secret_key, s3_server.access_key, "secretKey", "accessKey"):
        assert secret not in text
    for row, name in zip(rows, "ab", strict=True):
        assert f"prefix={s3_prefix}{name}/" in str(row["uri"]).replace("%2F", "/")

    async def held() -> list[tuple[int, int]]:
        """Per bucket, the object keys it holds and their bytes (other keys: the metadata copy, markers)."""
        out = []
        for name in "ab":
            storage = s3_server.storage(f"{s3_prefix}{name}/")
            try:
                objects = [i async for i in storage.list("") if _is_object_key(i.key)]
            finally:
                await storage.close()
            out.append((len(objects), sum(i.size_bytes for i in objects)))
        return out

    async def committed() -> int:
        store = await open_metadata_store(f"sqlite://{db}")
        try:
            return len(await store.list_objects([ObjectState.COMMITTED]))
        finally:
            await store.close()

    assert sum(int(str(r["objects"])) for r in rows) == asyncio.run(committed()) >= 3
    assert asyncio.run(held()) == [(r["objects"], r["bytes"]) for r in rows]
    # how the objects split between the two buckets is round robin's per-process random start
    assert all(r["health"] == "healthy" for r in rows)  # the node's report at start


def test_set_weights_checks_the_recorded_ids_and_writes_the_key_on_postgres(
    pg_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    meta = ["--metadata-url", pg_url, "--data-dir", str(tmp_path / "nowhere")]
    assert main(["buckets", "set-weights", *meta, "0:1,1:1"]) == 2  # nothing recorded yet
    assert "records no bucket list" in capsys.readouterr().err
    produce(tmp_path / "data", file_list(tmp_path), "--metadata-url", pg_url)
    capsys.readouterr()
    for bad, said in (
        ("0:1,2:1", "missing [1], unknown [2]"),
        ("0:1", "missing [1]"),
        ("0:0,1:0", "at least one must be above 0"),
        ("zero:one", "use id:weight"),
    ):
        assert main(["buckets", "set-weights", *meta, bad]) == 2
        assert said in capsys.readouterr().err
    assert main(["buckets", "set-weights", *meta, "1:3,0:1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"0": 1, "1": 3}

    async def stored() -> bytes | None:
        store = await open_metadata_store(pg_url)
        try:
            return await store.kv_get(WEIGHTS_KEY)
        finally:
            await store.close()

    assert asyncio.run(stored()) == b"0:1,1:3"
    rows = run_json(capsys, ["buckets", *meta])  # no data dir needed on shared metadata
    assert [(r["bucket_id"], r["uri"]) for r in rows] == [
        (0, f"file://{tmp_path / 'a'}"),
        (1, f"file://{tmp_path / 'b'}"),
    ]
    assert sum(int(str(r["objects"])) for r in rows) >= 1
    assert not (tmp_path / "nowhere").exists()


def test_set_weights_on_a_single_bucket_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    produce(tmp_path / "data", f"file://{tmp_path / 'only'}")
    capsys.readouterr()
    assert main(["buckets", "set-weights", "--data-dir", str(tmp_path / "data"), "0:1"]) == 2
    assert "weights need several" in capsys.readouterr().err
    rows = run_json(capsys, ["buckets", "--data-dir", str(tmp_path / "data")])
    assert [(r["bucket_id"], r["uri"], r["objects"]) for r in rows] == [(0, f"file://{tmp_path / 'only'}", 1)]
    assert main(["buckets", "--data-dir", str(tmp_path / "missing")]) == 2
    assert "no metadata at" in capsys.readouterr().err


async def test_a_running_node_applies_new_weights_without_a_restart(tmp_path: Path) -> None:
    config = small_config(
        data_buckets_strategy="sharding", data_buckets_weights="0:1,1:1", data_buckets_weights_poll_ms=100
    )
    client = await assembly.open_client(str(tmp_path / "data"), bucket_uri=file_list(tmp_path), config=config)
    try:
        storage = client.engine.storage
        assert isinstance(storage, MultiBucketStorage)
        assert isinstance(storage.strategy, Sharding)
        assert storage.strategy.weights == {0: 1, 1: 1}
        argv = ["buckets", "set-weights", "--data-dir", str(tmp_path / "data"), "0:0,1:1"]
        started = time.monotonic()
        assert await asyncio.to_thread(main, argv) == 0
        while storage.strategy.weights != {0: 0, 1: 1}:
            assert time.monotonic() - started < WEIGHTS_APPLIED_S_MAX, storage.strategy.weights
            await asyncio.sleep(0.05)
    finally:
        await client.close()


async def test_buckets_shows_a_blackholed_bucket_unhealthy_as_its_node_reports_it(
    s3_server: S3TestServer,
    s3_prefix: str,
    tmp_path: Path,
    fault_proxies: Callable[[], FaultProxy],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A running node whose primary stops answering publishes it; ``buckets`` (another reader of the
    data dir's metadata, while the node runs) shows it unhealthy with its error, without credentials,
    and the standby taking the new writes."""
    proxies = [fault_proxies(), fault_proxies()]
    bucket_list = ",".join(
        proxied(s3_server, p).uri(f"{s3_prefix}{n}/").replace("0@", f"{i}@", 1)
        for i, (p, n) in enumerate(zip(proxies, "ab", strict=True))
    )
    config = small_config(data_buckets_strategy="failover", data_buckets_request_timeout_ms=300)
    client = await assembly.open_client(str(tmp_path / "data"), bucket_uri=bucket_list, config=config)
    try:
        storage = client.engine.storage
        assert isinstance(storage, MultiBucketStorage)
        stream = await client.streams.create_and_open_stream()
        await asyncio.to_thread(proxies[0].blackhole)
        deadline_s = time.monotonic() + REPORT_WAIT_S_MAX
        rows: list[dict[str, object]] = []
        while not rows or rows[0]["health"] != "unhealthy" or not rows[1]["uploads_recent"]:
            assert time.monotonic() < deadline_s, rows
            await stream.append(RecordBatch(b"x" * 1000))
            await client.engine.force_upload(None)
            capsys.readouterr()
            argv = ["buckets", "--data-dir", str(tmp_path / "data"), "--json"]
            assert await asyncio.to_thread(main, argv) == 0
            rows = json.loads(capsys.readouterr().out)
    finally:
        await asyncio.to_thread(proxies[0].heal)
        await client.close()
    assert int(str(rows[0]["errors_recent"])) >= config.data_buckets_failover_errors
    assert "Timeout" in str(rows[0]["last_error"])
    text = json.dumps(rows)
    for secret in (s3_server.secret_key, s3_server.access_key):
        assert secret not in text
    assert rows[1]["health"] == "healthy"
    assert float(str(rows[1]["write_share"])) > 0
