"""kill -9 of a real WAL writer process at random moments; every acknowledged record must survive.

Each iteration starts ``tests/crash/wal_writer.py`` on the same WAL file, waits until it recovered and
logged what came back, lets it append with many producers (and trim) for a random time, and SIGKILLs
it. The next iteration's recovery is checked against every earlier iteration's log. Seeds are
printed; replay with S3STREAM_SEED. S3STREAM_WAL_CRASH_ITERATIONS overrides the count (default 30).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from crc32c import crc32c

from tests.crash.wal_writer import CONFIG
from tests.directio import loop_writes_work
from wal import BlockWAL, WalLockedError

ROOT = Path(__file__).resolve().parents[2]
ITERATIONS = int(os.environ.get("S3STREAM_WAL_CRASH_ITERATIONS", "30"))


@dataclass
class History:
    intents: set[tuple[int, int]] = field(default_factory=set)
    acked: dict[int, tuple[int, int]] = field(default_factory=dict)
    trim_requested: int = 0
    trim_durable: int = 0

    def read_log(self, path: Path) -> None:
        if not path.exists():
            return
        for line in path.read_text().splitlines():
            parts = line.split()
            try:
                if parts[0] == "I" and len(parts) == 3:
                    self.intents.add((int(parts[1]), int(parts[2])))
                elif parts[0] == "A" and len(parts) == 4:
                    self.acked[int(parts[1])] = (int(parts[2]), int(parts[3]))
                elif parts[0] == "t" and len(parts) == 2:
                    self.trim_requested = max(self.trim_requested, int(parts[1]))
                elif parts[0] == "T" and len(parts) == 2:
                    self.trim_durable = max(self.trim_durable, int(parts[1]))
            except (ValueError, IndexError):
                continue  # a line cut by the kill

    def check(self, recovered: list[tuple[int, int, int]], where: str) -> None:
        offsets = [o for o, _, _ in recovered]
        assert offsets == sorted(set(offsets)), f"{where}: offsets not strictly increasing"
        got = {o: (c, n) for o, c, n in recovered}
        for o, ident in got.items():
            assert ident in self.intents, f"{where}: phantom record at offset {o}"
            if o in self.acked:
                assert self.acked[o] == ident, f"{where}: record at {o} differs from the acknowledged one"
            assert o >= self.trim_durable, f"{where}: record at {o} below durable trim {self.trim_durable}"
        lost = [o for o in self.acked if o >= self.trim_requested and o not in got]
        assert not lost, f"{where}: {len(lost)} acknowledged records lost, first at {min(lost)}"


def read_recovered(path: Path) -> list[tuple[int, int, int]]:
    out = []
    for line in path.read_text().splitlines():
        o, c, n = line.split()
        out.append((int(o), int(c), int(n)))
    return out


def start_writer(wal: Path, logs: Path, iteration: int, seed: int, aio: str = "off") -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.crash.wal_writer", str(wal), str(logs), str(iteration), str(seed), aio],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )


def wait_ready(proc: subprocess.Popen[str]) -> tuple[int, str]:
    """The writer's next offset and its WAL's write mode, once it recovered."""
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("READY"), f"writer did not start: {line!r} (exit {proc.poll()})"
    _, offset, mode = line.split()
    return int(offset), mode


@pytest.mark.crash
@pytest.mark.timeout(max(400, 13 * ITERATIONS))  # long runs (S3STREAM_WAL_CRASH_ITERATIONS) take longer
# the I/O threads (default), Linux AIO, io_uring and AIO beside the threads (adaptive) where there are
@pytest.mark.parametrize("aio", ["off", "auto", "uring", "adaptive"])
async def test_sigkill_at_random_moments_loses_no_acknowledged_record(
    tmp_path: Path, rng_seed: int, aio: str
) -> None:
    rng = random.Random(rng_seed)
    wal_path = tmp_path / "wal.dat"
    history = History()
    started = time.monotonic()
    kills_while_appending = 0
    i = 0
    # At least ITERATIONS kills, and more (up to 3x) until the log has wrapped around the ring three
    # times: on a loaded machine the writer appends less per iteration.
    while i < ITERATIONS or (
        max(history.acked, default=0) <= 3 * CONFIG.record_area_bytes and i < 3 * ITERATIONS
    ):
        proc = start_writer(wal_path, tmp_path, i, rng.randrange(1 << 30), aio)
        try:
            _, mode = wait_ready(proc)
            if aio == "uring" and loop_writes_work(wal_path.parent, "uring"):
                assert "io_uring" in mode, mode
            if aio == "adaptive" and loop_writes_work(wal_path.parent, "adaptive"):
                assert "+adaptive(" in mode, mode
            history.check(read_recovered(tmp_path / f"recovered.{i}"), f"iteration {i} (seed {rng_seed})")
            time.sleep(rng.uniform(0.01, 0.5))
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        history.read_log(tmp_path / f"log.{i}")
        kills_while_appending += (tmp_path / f"log.{i}").exists()
        i += 1
    assert kills_while_appending >= ITERATIONS // 2
    # the last kill's damage, checked in-process; then appends go on and survive a clean close
    wal = await BlockWAL.open(wal_path, CONFIG)
    records = [(r.offset, crc32c(r.data), len(r.data)) async for r in wal.recover()]
    history.check(records, f"final recovery (seed {rng_seed})")
    assert wal.next_offset > 3 * CONFIG.record_area_bytes, "the test should wrap around several times"
    await wal.trim(wal.next_offset)  # checked above; the ring may be full (on_full="wait" would block)
    more = [await wal.append(f"after-{k}".encode()) for k in range(10)]
    await wal.close()
    wal = await BlockWAL.open(wal_path, CONFIG)
    tail = [(r.offset, r.data) async for r in wal.recover()][-10:]
    assert tail == [(o, f"after-{k}".encode()) for k, o in enumerate(more)]
    await wal.close()
    print(f"{i} kills, {len(history.acked)} acknowledged records, {time.monotonic() - started:.1f}s")


@pytest.mark.crash
@pytest.mark.timeout(60)
def test_a_second_process_cannot_open_a_wal_in_use(tmp_path: Path) -> None:
    wal_path = tmp_path / "wal.dat"
    proc = start_writer(wal_path, tmp_path, 0, 1)
    try:
        wait_ready(proc)
        probe = subprocess.run(
            [sys.executable, "-c", _PROBE, str(wal_path)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert probe.stdout.strip() == "WalLockedError", probe.stderr
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    # the lock dies with the process: now it opens
    probe = subprocess.run(
        [sys.executable, "-c", _PROBE, str(wal_path)], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert probe.stdout.strip() == "opened", probe.stderr
    assert WalLockedError.__name__ == "WalLockedError"


_PROBE = """
import asyncio, sys
from tests.crash.wal_writer import CONFIG
from wal import BlockWAL, WalLockedError
from wal.uring import Uring
async def main():
    try:
        wal = await BlockWAL.open(sys.argv[1], CONFIG)
    except WalLockedError:
        print("WalLockedError")
        return
    print("opened")
    await wal.close()
asyncio.run(main())
"""
