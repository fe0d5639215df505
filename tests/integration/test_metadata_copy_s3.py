"""On a real S3 server: the metadata copy survives a lost data dir. A writer process is killed with
kill -9 at a random moment, its data dir removed, and ``s3stream restore`` rebuilds it from the bucket:
every acknowledged upload reads back byte-exact, every acknowledged KV pair is there, the restored
metadata is exactly the killed process's minus only changes it never acknowledged, and the restored
data dir continues (appends after the restored end offsets, a higher node epoch)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from random import Random

import pytest

import s3stream
from s3stream import RecordBatch
from s3stream.cli import main
from s3stream.metacopy.objects import copies_prefix, log_key, parse_copy_key
from s3stream.metadata import cluster_schema
from s3stream.storage.uri import open_storage
from tests.support.metacopy_child import CONFIG, STREAMS, payload
from tests.support.metacopy_replay import replay_uncopied
from tests.support.s3 import S3TestServer

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
COPY_TABLES = {"copy_state", "pending_copy", "schema_version"}


def dump(path: Path) -> dict[str, list[tuple[object, ...]]]:
    conn = sqlite3.connect(path)
    try:
        names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {
            n: sorted(conn.execute(f"SELECT * FROM {n}").fetchall(), key=repr)
            for n in names
            if n not in COPY_TABLES
        }
    finally:
        conn.close()


def data_tables(path: Path) -> dict[str, list[tuple[object, ...]]]:
    """:func:`dump` without the session tables (node sessions, leases, the cluster's state)."""
    sessions = ("nodes", "leases", *cluster_schema.CLUSTER_TABLES)
    return {n: rows for n, rows in dump(path).items() if n not in sessions}


def run_child_until_killed(data_dir: Path, uri: str, rng: Random) -> list[dict[str, object]]:
    """Start the writer, let it run a random while after phase 1, kill -9 it; its printed facts."""
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.support.metacopy_child", str(data_dir), uri],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    facts: list[dict[str, object]] = []
    ready = threading.Event()

    def read() -> None:
        assert child.stdout is not None
        for line in child.stdout:
            if line.endswith("\n"):  # a torn last line was never a whole fact
                facts.append(json.loads(line))
                if "ready" in facts[-1]:
                    ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 240
        while not ready.wait(0.2) and child.poll() is None and time.monotonic() < deadline:
            pass
        if not ready.is_set():
            child.kill()
            raise AssertionError(f"the writer never got ready: {child.communicate()[1][-3000:]}")
        time.sleep(rng.uniform(0.5, 4.0))
        assert child.poll() is None, child.communicate()[1][-3000:]
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait(30)
        reader.join(30)
    return facts


async def test_kill_9_then_rm_rf_then_restore_keeps_everything_acknowledged(
    tmp_path: Path,
    s3_server: S3TestServer,
    s3_prefix: str,
    rng_seed: int,
    capsys: pytest.CaptureFixture[str],
) -> None:
    uri = s3_server.uri(s3_prefix)
    lost, restored = tmp_path / "lost", tmp_path / "restored"
    facts = run_child_until_killed(lost, uri, Random(rng_seed))
    ready = next(f["ready"] for f in facts if "ready" in f)
    assert ready["compacted"] >= 2  # type: ignore[index]
    uploaded: dict[int, int] = {}
    for fact in facts:
        if "uploaded" in fact:
            sid, end = fact["uploaded"]  # type: ignore[misc]
            uploaded[sid] = max(uploaded.get(sid, 0), end)
    acked_kv = {k: v.encode() for k, v in (f["kv"] for f in facts if "kv" in f)}  # type: ignore[misc]
    print(f"{len(facts)} facts, {len(acked_kv)} KV pairs acknowledged, uploaded ends {uploaded}")
    # What the killed process had committed locally (kept aside only to compare with), then the disk is lost.
    shutil.copy(lost / "metadata.db", tmp_path / "killed.db")
    for end in ("-wal", "-shm"):
        if (lost / f"metadata.db{end}").exists():
            shutil.copy(lost / f"metadata.db{end}", tmp_path / f"killed.db{end}")
    shutil.rmtree(lost)

    capsys.readouterr()
    assert (
        await asyncio.to_thread(main, ["restore", "--bucket-uri", uri, "--data-dir", str(restored), "--json"])
        == 0
    )
    out = capsys.readouterr().out
    print(out)
    report = json.loads(out.strip().splitlines()[-1])
    assert report["stopped"] is None
    # the restored metadata is the killed process's, minus groups it had not yet copied (never
    # acknowledged); groups killed between their PUT and the deletion of their pending rows are in both
    replayed = tmp_path / "replayed.db"
    replay_uncopied(
        tmp_path / "killed.db", restored / "metadata.db", replayed, restored_last_seq=report["last_seq"]
    )
    # node sessions and leases (heartbeats, lease renewals) are liveness, left out of the copy's log
    # (sqlite_copy.SESSION_CHANGES): every other table must match
    assert data_tables(replayed) == data_tables(tmp_path / "killed.db")

    async with await s3stream.open(restored, bucket_uri=uri, config=CONFIG) as client:
        metas = {m.stream_id: m for m in await client.streams.list_streams()}
        assert len(metas) == STREAMS
        assert metas[min(metas)].start_offset == 30  # the trim
        node_epochs = [r[0] for r in dump(replayed)["nodes"]]
        assert client.engine.node_epoch > max(node_epochs)  # type: ignore[type-var]
        for key, value in acked_kv.items():
            assert await client.kv.get(key) == value
        assert await client.kv.get("ready-2") == b"value-2"
        assert await client.kv.get("ready-3") is None
        for sid, meta in metas.items():
            assert meta.end_offset >= uploaded.get(sid, ready["ends"][str(sid)])  # type: ignore[index]
            stream = await client.streams.open_stream(sid, epoch=meta.epoch + 1)
            offset = meta.start_offset
            while offset < meta.end_offset:
                batches = await stream.fetch(offset, meta.end_offset, max_bytes=1 << 20)
                assert batches, f"stream {sid} reads nothing at {offset}"
                for batch in batches:
                    assert batch.base_offset == offset
                    assert bytes(batch.payload) == payload(sid, offset)
                    offset = batch.end_offset
            assert await stream.append(RecordBatch(b"after restore")) == meta.end_offset
            await stream.close()


async def test_the_restore_command_stops_at_a_missing_log_object_and_names_the_group(
    tmp_path: Path, s3_server: S3TestServer, s3_prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    uri = s3_server.uri(s3_prefix)
    async with await s3stream.open(tmp_path / "a", bucket_uri=uri, config=CONFIG) as client:
        copy = client.components["metadata_copy"]
        for i in range(5):
            await client.kv.put(f"k{i}", b"v")
        last = copy.copied_seq  # type: ignore[attr-defined]
        prefix = copy.prefix  # type: ignore[attr-defined]
    storage = open_storage(uri)
    try:
        keys = [info.key async for info in storage.list(copies_prefix(CONFIG.namespace))]
        parsed = [parse_copy_key(CONFIG.namespace, k) for k in keys]
        logs = sorted((p for p in parsed if p is not None and p.kind == "log"), key=lambda p: p.first_seq)
        gap = logs[-2]
        await storage.delete([log_key(prefix, gap.first_seq, gap.last_seq)])
    finally:
        await storage.close()
    assert last >= gap.last_seq
    capsys.readouterr()
    assert (
        await asyncio.to_thread(main, ["restore", "--bucket-uri", uri, "--data-dir", str(tmp_path / "b")])
        == 1
    )
    out = capsys.readouterr().out
    assert f"last commit restored: group {gap.first_seq - 1} at " in out
    assert f"stopped early: group {gap.first_seq} is in no log object" in out
    assert (
        await asyncio.to_thread(main, ["restore", "--bucket-uri", uri, "--data-dir", str(tmp_path / "b")])
        == 2
    )  # never overwrites
    assert "never overwrites" in capsys.readouterr().err
    async with await s3stream.open(tmp_path / "b", config=CONFIG) as client:  # the recorded bucket
        assert await client.kv.get(f"k{0}") == b"v"
