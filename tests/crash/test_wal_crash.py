"""kill -9 of a real WAL writer process at random moments; every acknowledged record must survive.

Each iteration starts ``tests/crash/wal_writer.py`` on the same WAL file, waits until it recovered and
logged what came back, lets it append with many producers (and trim) for a random time, and SIGKILLs
it. The next iteration's recovery is checked against every earlier iteration's log. Seeds are
printed; replay with S3STREAM_SEED. S3STREAM_WAL_CRASH_ITERATIONS overrides the count (default 30).

Two harsher kinds of iteration are mixed in: every fourth writer kills itself in the middle of its
recovery (right after the bridge over the last session's torn tail, or right after the new header),
and after some kills the last write group on the file gets a sector of zeros, a torn write (only when
no acknowledged record lies in it: a group in flight at the kill may be torn, a durable one may not).
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
from tests.support.directio import loop_writes_work
from wal import BlockWAL, WalLockedError
from wal.format import FLAG_FIRST, PAD_MAGIC, decode_record_header, decode_wal_header
from wal.recovery import Layout, Scanner

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


def start_writer(
    wal: Path, logs: Path, iteration: int, seed: int, aio: str = "off", kill_after_writes: int = 0
) -> subprocess.Popen[str]:
    args = [str(wal), str(logs), str(iteration), str(seed), aio, str(kill_after_writes)]
    return subprocess.Popen(
        [sys.executable, "-m", "tests.crash.wal_writer", *args], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )


class _ReadOnlyFile:
    """The WAL file as a device the recovery scan can read (never written)."""

    mode = "read-only"

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_RDONLY)
        self.size_bytes = os.fstat(self.fd).st_size

    def write(self, pos: int, data: object) -> None:
        raise AssertionError("read-only")

    def read_into(self, pos: int, buf: memoryview) -> int:
        return os.preadv(self.fd, [buf], pos)

    def sync(self) -> None:
        pass

    def close(self) -> None:
        os.close(self.fd)


def tear_last_group(wal_path: Path, history: History, rng: random.Random) -> bool:
    """Zero one 512-byte sector of the log's last write group, as a write torn by the kill would leave
    it, unless an acknowledged record lies in the group (it was durable: no crash tears it). True if
    a sector was zeroed."""
    device = _ReadOnlyFile(wal_path)
    try:
        block = CONFIG.block_size_bytes
        head = bytearray(2 * block)
        device.read_into(0, memoryview(head))
        copies = [decode_wal_header(head[k * block : (k + 1) * block]) for k in (0, 1)]
        header = max((c for c in copies if c is not None), key=lambda c: c.seq)
        layout = Layout(block, CONFIG.device_bytes)
        scanner = Scanner(device, layout, header)  # type: ignore[arg-type]
        while not scanner.done:
            scanner.next_batch()
        assert scanner.result is not None
        end, starts = scanner.result.end_offset, scanner.result.group_starts
        if not starts or starts[-1] >= end:
            return False
        first = starts[-1]
        probe = bytearray(block)
        device.read_into(layout.phys(first) - layout.phys(first) % block, memoryview(probe))
        rec = decode_record_header(probe[layout.phys(first) % block :])
        if rec is None or rec.magic == PAD_MAGIC:
            return False  # a bridge or wrap padding, written and synced before any group after it
        if any(first <= o < end for o in history.acked):
            return False
        # In flight with it at the kill: at most K - 1 later groups (K = the header's inflight_groups),
        # so no more may start in the window after it (their headers may be valid, bodies torn).
        probe_scan = Scanner(device, layout, header)  # type: ignore[arg-type]
        later = 0
        for pos in range(first + block, first + header.window + block, block):
            h = probe_scan._header_at(pos)
            later += h is not None and h.magic != PAD_MAGIC and bool(h.flags & FLAG_FIRST)
        probe_scan.reader.close()
        if later >= header.inflight_groups:
            return False
    finally:
        device.close()
    sector = rng.randrange(first // 512, -(-end // 512)) * 512
    fd = os.open(wal_path, os.O_WRONLY)
    try:
        os.pwrite(fd, bytes(512), layout.phys(sector))
        os.fsync(fd)
    finally:
        os.close(fd)
    return True


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
    kills_while_appending = kills_in_recovery = torn = 0
    i = 0
    # At least ITERATIONS kills, and more (up to 3x) until the log has wrapped around the ring three
    # times: on a loaded machine the writer appends less per iteration.
    while i < ITERATIONS or (
        max(history.acked, default=0) <= 3 * CONFIG.record_area_bytes and i < 3 * ITERATIONS
    ):
        kill_after = rng.choice((1, 2)) if i % 4 == 3 else 0
        proc = start_writer(wal_path, tmp_path, i, rng.randrange(1 << 30), aio, kill_after)
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if kill_after and not line:
                # killed itself in its recovery, after the bridge or the header it wrote
                assert proc.wait() == -signal.SIGKILL
                kills_in_recovery += 1
                i += 1
                continue
            assert line.startswith("READY"), f"writer did not start: {line!r} (exit {proc.poll()})"
            mode = line.split()[2]
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
        if rng.random() < 0.3:
            torn += tear_last_group(wal_path, history, rng)
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
    print(
        f"{i} kills ({kills_in_recovery} in recovery, {torn} torn last groups), "
        f"{len(history.acked)} acknowledged records, {time.monotonic() - started:.1f}s"
    )


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
