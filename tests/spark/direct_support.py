"""What the direct path's crash and forcing tests share: a driver subprocess and the exactly-once checks.

A :class:`DirectRun` is one topic ``rate`` (rows ``i``: key ``str(i)``, partition ``i % partitions``)
written by ``direct_job.py`` drivers into one bucket prefix from one checkpoint. Its checks are the
kill matrix's: every row once, offsets contiguous from 0 in every partition, and after a garbage
collection past every TTL exactly the committed objects left in the bucket.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from compaction.gc import GarbageCollector
from s3stream.assembly import open_sync
from s3stream.config import Config
from s3stream.facade import SyncClient
from s3stream.metadata.base import ObjectState
from s3stream.objectformat import object_key
from spark_sink.reader import read_records

JOB = Path(__file__).with_name("direct_job.py")
ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")
DRIVER_TIMEOUT_S = 1200
"""How long a driver waits for its micro-batches before it stops its query and exits 3 (JVM starts
and Spark jobs take minutes on a loaded two-core machine; the tests' own timeouts bound the rest)."""


def job_env() -> dict[str, str]:
    """The environment of a driver subprocess (and, inherited, of its executors)."""
    return dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def batches_of(events: list[dict[str, Any]]) -> list[tuple[int, bool]]:
    """(batch id, skipped) of every micro-batch the sink finished."""
    return [(e["batch_id"], e["skipped"]) for e in events if e["event"] == "batch"]


def events_of(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


@dataclass(frozen=True)
class DirectRun:
    """One topic written by ``direct_job.py`` drivers; ``data_dir`` is the engine the checks open."""

    data_dir: Path
    bucket_uri: str
    checkpoint: Path
    rows: int
    partitions: int = 3
    value_bytes: int = 200
    metadata_url: str = ""

    def args(self, until: int, *extra: str, data_dir: Path | None = None) -> list[str]:
        out = [
            sys.executable,
            str(JOB),
            "--data-dir",
            str(data_dir or self.data_dir),
            "--bucket-uri",
            self.bucket_uri,
            "--checkpoint",
            str(self.checkpoint),
            "--rows-per-batch",
            str(self.rows),
            "--until-batch",
            str(until),
            "--partitions",
            str(self.partitions),
            "--value-bytes",
            str(self.value_bytes),
            "--timeout-s",
            str(DRIVER_TIMEOUT_S),
            *extra,
        ]
        if self.metadata_url:
            out += ["--metadata-url", self.metadata_url]
        return out

    def run(
        self, until: int, *extra: str, data_dir: Path | None = None, timeout_s: float = 900
    ) -> tuple[int, list[dict[str, Any]]]:
        """Run a driver to ``until`` (or its death by SIGKILL); any other exit fails the test. Its
        output is kept beside the data dir (``<data dir>.stdout``, ``.stderr``, overwritten)."""
        target = data_dir or self.data_dir
        proc = subprocess.run(
            self.args(until, *extra, data_dir=target),
            env=job_env(),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        target.with_name(target.name + ".stdout").write_text(proc.stdout)
        target.with_name(target.name + ".stderr").write_text(proc.stderr)
        events = events_of(proc.stdout)
        if proc.returncode not in (0, -signal.SIGKILL):
            errors = [f"{e['type']}: {e['message'][:1500]}" for e in events if e["event"] == "error"]
            pytest.fail(
                f"driver exited {proc.returncode}; its sink raised {errors}\nstderr:\n{proc.stderr[-3000:]}"
            )
        return proc.returncode, events

    def open(self) -> SyncClient:
        config = Config.from_sources(env={}, metadata_url=self.metadata_url)
        return open_sync(self.data_dir, bucket_uri=self.bucket_uri, config=config)

    def check_exact(self, batches: int) -> None:
        """Every row of micro-batches ``0 .. batches - 1`` once, offsets contiguous from 0."""
        with self.open() as client:
            records = read_records(client, "rate")
        values: list[int] = []
        for part, recs in records.items():
            assert [r.offset for r in recs] == list(range(len(recs))), (
                f"partition {part}: offsets contiguous from 0"
            )
            for r in recs:
                i = int(r.key or b"")
                assert i % self.partitions == part
                values.append(i)
        assert len(values) == len(set(values)), f"{len(values) - len(set(values))} duplicate rows"
        assert sorted(values) == list(range(batches * self.rows)), "missing or extra rows"

    def gc_leaves_only_committed(self) -> tuple[int, int]:
        """Run GC past every TTL; returns (keys before, keys after) and checks keys after == committed."""
        with self.open() as client:

            def run(coro: Coroutine[Any, Any, T]) -> T:
                return asyncio.run_coroutine_threadsafe(coro, client.loop).result()

            engine = client.client.engine
            namespace = client.client.config.namespace

            async def keys() -> set[str]:
                return {o.key async for o in engine.storage.list("") if f"/{namespace}/" in o.key}

            before = run(keys())
            gc = GarbageCollector(
                engine.metadata,
                engine.storage,
                namespace=namespace,
                retention_ms=0,
                orphan_ttl_ms=0,
                clock_ms=lambda: 10**13,  # far past the prepared TTL, the retention and the orphan TTL
            )
            for _ in range(3):
                run(gc.collect(scan_orphans=True))
            committed = run(engine.metadata.list_objects([ObjectState.COMMITTED]))
            want = {object_key(o.object_id, namespace) for o in committed}
            after = run(keys())
        assert after == want, (
            f"uncommitted keys left: {sorted(after - want)}; missing: {sorted(want - after)}"
        )
        return len(before), len(after)
