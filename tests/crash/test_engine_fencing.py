"""Two processes (nodes 1 and 2, own WALs) on one SQLite metadata file and one bucket: epochs fence."""

from __future__ import annotations

import asyncio
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from s3stream.metadata.sqlite import SqliteMetadataStore

pytestmark = pytest.mark.crash
ROOT = Path(__file__).resolve().parents[2]
HELD_ELSEWHERE = (["ERR NotOwnerError"], ["ERR UnavailableError"])
"""The refusals of an open of a stream another node holds: NotOwnerError while that node's lease
runs, UnavailableError(NODE_TAKEOVER_IN_PROGRESS) once it lapsed (a killed node's lease runs on)."""


def node(tmp: Path, node_id: int, stream_id: int, epoch: int, action: str = "append-close") -> list[str]:
    args = [sys.executable, "-m", "tests.crash.engine_epoch_client", str(tmp / f"node{node_id}"), str(tmp),
            str(node_id), str(stream_id), str(epoch), action]  # fmt: skip
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.split("\n")[:-1]


async def create_stream(tmp: Path) -> int:
    metadata = await SqliteMetadataStore.open(str(tmp / "metadata.db"))
    try:
        await metadata.register_node(node_id=0, node_epoch=1)  # type: ignore[arg-type]
        return int(await metadata.create_stream(node_id=0, node_epoch=1))  # type: ignore[arg-type]
    finally:
        await metadata.close()


def test_a_newer_epoch_in_another_process_fences_the_older_one(tmp_path: Path) -> None:
    stream_id = asyncio.run(create_stream(tmp_path))
    assert node(tmp_path, 1, stream_id, epoch=1) == ["OK 0"]
    assert node(tmp_path, 2, stream_id, epoch=2) == ["OK 1"]
    # Node 1 comes back with its old epoch: fenced, in its own process.
    assert node(tmp_path, 1, stream_id, epoch=1) == ["ERR FencedError"]
    # Node 1 with a newer epoch takes the stream back and continues after node 2's data.
    assert node(tmp_path, 1, stream_id, epoch=3) == ["OK 2"]


def start_node(tmp: Path, node_id: int, stream_id: int, epoch: int, action: str) -> subprocess.Popen[str]:
    args = [sys.executable, "-m", "tests.crash.engine_epoch_client", str(tmp / f"node{node_id}"), str(tmp),
            str(node_id), str(stream_id), str(epoch), action]  # fmt: skip
    return subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def append_until_killed(tmp: Path, node_id: int, stream_id: int, epoch: int, acks: int) -> dict[int, bytes]:
    """Node ``node_id`` appends from 32 tasks; SIGKILLed after ``acks`` acknowledgements: what it acked."""
    proc = start_node(tmp, node_id, stream_id, epoch, "append-many")
    assert proc.stdout is not None
    acked: dict[int, bytes] = {}
    for line in proc.stdout:
        parts = line.split()
        if len(parts) == 3 and parts[0] == "OK":
            acked[int(parts[1])] = parts[2].encode() * 50
            if len(acked) >= acks:
                proc.send_signal(signal.SIGKILL)
                break
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, err[-3000:]
    for line in out.splitlines():  # acknowledged before the kill landed
        parts = line.split()
        if len(parts) == 3 and parts[0] == "OK":
            acked[int(parts[1])] = parts[2].encode() * 50
    return acked


def read_all(tmp: Path, node_id: int, stream_id: int, epoch: int) -> dict[int, bytes]:
    lines = node(tmp, node_id, stream_id, epoch, "read")
    assert all(line.startswith("R ") for line in lines), lines
    return {int(o): p.encode() for _, o, p in (line.split(" ", 2) for line in lines)}


def test_a_writer_killed_then_fenced_keeps_what_it_acknowledged_and_recovers_nothing_twice(
    tmp_path: Path, rng_seed: int
) -> None:
    rng = random.Random(rng_seed)
    stream_id = asyncio.run(create_stream(tmp_path))
    acked = append_until_killed(tmp_path, 1, stream_id, 1, rng.randint(50, 300))
    # Node 1 died holding the stream: a newer epoch cannot take it before node 1's recovery closed it
    # (named as its owner while node 1's lease runs, a takeover's business once it lapsed).
    assert node(tmp_path, 2, stream_id, epoch=2) in HELD_ELSEWHERE
    # Node 1 restarts (killed once more at a random moment of its restart recovery first), reads back
    # everything it acknowledged, and closes.
    proc = start_node(tmp_path, 1, stream_id, 1, "read")
    time.sleep(rng.uniform(0.3, 1.5))
    proc.kill()
    proc.communicate(timeout=60)
    got = read_all(tmp_path, 1, stream_id, 1)
    assert {o: got.get(o) for o in acked} == acked
    # Node 2 takes over with a newer epoch, and is killed while appending.
    end = max(got) + 1
    assert node(tmp_path, 2, stream_id, epoch=2) == [f"OK {end}"]
    acked |= {end: b"node2"}
    acked |= append_until_killed(tmp_path, 2, stream_id, 2, rng.randint(50, 300))
    # The fenced writer comes back with its old epoch: fenced, in its own process; its WAL's records
    # of the stream (epoch 1) are not replayed over node 2's.
    assert node(tmp_path, 1, stream_id, epoch=1) == ["ERR FencedError"]
    assert node(tmp_path, 1, stream_id, epoch=3) in HELD_ELSEWHERE  # node 2 still holds it
    got = read_all(tmp_path, 2, stream_id, 2)  # node 2's restart recovery, then every record
    assert sorted(got) == list(range(len(got))), "gap or overlap"
    assert {o: got.get(o) for o in acked} == acked
    assert all(p == b"node1" or p.startswith(b"node1:") for o, p in got.items() if o < end)
    assert all(p == b"node2" or p.startswith(b"node2:") for o, p in got.items() if o >= end)


def test_a_stream_held_open_by_one_process_cannot_be_opened_by_another(tmp_path: Path) -> None:
    stream_id = asyncio.run(create_stream(tmp_path))
    args = [sys.executable, "-m", "tests.crash.engine_epoch_client", str(tmp_path / "node1"), str(tmp_path),
            "1", str(stream_id), "1", "append-hold"]  # fmt: skip
    holder = subprocess.Popen(args, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None
    assert holder.stdin is not None
    assert holder.stdout.readline().strip() == "OK 0"
    assert holder.stdout.readline().strip() == "HELD"
    # The owner is alive: the refusal names it (Kafka's NOT_LEADER); it must close first.
    assert node(tmp_path, 2, stream_id, epoch=2) == ["ERR NotOwnerError"]
    assert node(tmp_path, 2, stream_id, epoch=0) == ["ERR FencedError"]
    holder.stdin.close()
    assert holder.stdout.read().split("\n")[:-1] == ["OK 1"]
    assert holder.wait(timeout=30) == 0
    assert node(tmp_path, 2, stream_id, epoch=2) == ["OK 2"]


def test_a_second_process_cannot_open_a_data_dir_in_use(tmp_path: Path) -> None:
    from s3stream.assembly import open_client
    from tests.crash.engine_epoch_client import CONFIG

    async def hold_and_try() -> str:
        client = await open_client(tmp_path, config=CONFIG)
        try:
            code = (
                "import asyncio, sys\n"
                "from s3stream.assembly import open_client\n"
                "from s3stream.errors import ConflictError\n"
                "from tests.crash.engine_epoch_client import CONFIG\n"
                "async def main():\n"
                "    try:\n"
                f"        await open_client({str(tmp_path)!r}, config=CONFIG)\n"
                "    except ConflictError as exc:\n"
                "        print('refused', exc)\n"
                "asyncio.run(main())\n"
            )
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-c", code, cwd=ROOT, stdout=asyncio.subprocess.PIPE
            )
            out, _ = await proc.communicate()
            return out.decode()
        finally:
            await client.close()

    assert asyncio.run(hold_and_try()).startswith("refused data dir in use")
