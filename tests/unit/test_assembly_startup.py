"""Start-up work happens at start-up: the S3 client is created when the assembly opens the storage,
and an application can freeze its start-up heap (docs/architecture.md, "Latency and Python's garbage
collector")."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

from s3stream.assembly import open_block_wal
from s3stream.binding import open_storage
from s3stream.config import Config
from s3stream.heap import freeze_startup_heap
from s3stream.storage.local import LocalObjectStorage
from s3stream.storage.s3 import S3ObjectStorage
from wal.aio import Aio

S3_URI = "0@s3://bucket?region=us-east-1&endpoint=http://127.0.0.1:9&pathStyle=true&accessKey=a&secretKey=b"


async def test_the_s3_client_is_created_when_the_assembly_opens_the_storage(tmp_path: Path) -> None:
    storage = await open_storage(tmp_path, S3_URI)  # creating the client sends no request
    try:
        assert isinstance(storage, S3ObjectStorage)
        assert storage._client is not None
        client = storage._client
        await storage.connect()  # idempotent
        assert storage._client is client
    finally:
        await storage.close()


async def test_a_local_storage_needs_no_start_up_work(tmp_path: Path) -> None:
    storage = await open_storage(tmp_path, None)
    assert isinstance(storage, LocalObjectStorage)
    await storage.close()


def test_freeze_startup_heap_moves_live_objects_out_of_the_collectors_scans() -> None:
    class Node:
        def __init__(self) -> None:
            self.peer: Node | None = None

    kept = Node()
    garbage = Node()
    garbage.peer = garbage  # a cycle: collected before the freeze, not frozen with the live objects
    del garbage
    try:
        frozen = freeze_startup_heap()
        # (frozen objects that die later leave the count, e.g. another thread's of an earlier test)
        assert 0 < gc.get_freeze_count() <= frozen
        assert gc.isenabled()  # the collector stays on
        assert not any(obj is kept for obj in gc.get_objects())  # frozen: out of every generation
        assert not any(type(obj) is Node for obj in gc.get_objects())  # the cycle was collected first
        later = Node()
        assert any(obj is later for obj in gc.get_objects())  # new objects are tracked as usual
    finally:
        gc.unfreeze()
    assert any(obj is kept for obj in gc.get_objects())


@pytest.mark.parametrize("aio", ["auto", "off"])
async def test_s3_wal_aio_reaches_the_block_wal(tmp_path: Path, aio: str) -> None:
    wal = await open_block_wal(tmp_path / "wal", Config(wal_aio=aio), node_epoch=1)  # type: ignore[arg-type]
    try:
        await wal.recover()
        await wal.append(b"x" * 100)
        block_wal = wal._wal
        assert block_wal._config.aio == aio
        if aio == "off":
            assert block_wal.stats["aio_writes"] == 0
        elif getattr(block_wal._device, "direct", False) and _kernel_has_aio():
            assert block_wal.stats["aio_writes"] > 0  # this filesystem and kernel take AIO: it is used
    finally:
        await wal.close()


def _kernel_has_aio() -> bool:
    probe = Aio.create(1)
    if probe is None:
        return False
    probe.close()
    return True


def test_opening_a_local_data_dir_does_not_import_botocore() -> None:
    import subprocess
    import sys

    code = (
        "import asyncio, sys, tempfile, s3stream\n"
        "from s3stream import Config\n"
        "config = Config(wal_capacity_bytes=8 << 20, wal_record_max_bytes=1 << 20, record_max_bytes=1 << 20)\n"
        "async def main():\n"
        "    with tempfile.TemporaryDirectory() as d:\n"
        "        await (await s3stream.open(d, config=config)).close()\n"
        "asyncio.run(main())\n"
        "print('botocore' in sys.modules)\n"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, check=True)
    assert out.stdout.strip() == "False"
