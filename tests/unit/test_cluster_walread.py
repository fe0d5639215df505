"""Reading a dead node's block WAL read-only: what its own recovery would replay, not a byte written."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from s3stream.assembly import open_block_wal
from s3stream.cluster.walread import read_dead_wal
from s3stream.engine.walbody import encode_plain
from s3stream.errors import ConflictError, CorruptionError, UnavailableError
from s3stream.record import StreamRecordBatch
from tests.support.configs import small_config


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


async def _write_wal(path: Path, *, node_id: int, count: int, trim_to: int | None = None) -> list[int]:
    config = small_config(node_id=node_id, wal_aio="off")
    wal = await open_block_wal(path, config, node_epoch=4)
    offsets = []
    for i in range(count):
        offsets.append(await wal.append([encode_plain(StreamRecordBatch(1, 0, i, 1, f"r{i}".encode()))]))
    if trim_to is not None:
        await wal.trim(offsets[trim_to])
    await wal.close()
    return offsets


async def test_reads_every_untrimmed_record_and_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "wal"
    offsets = await _write_wal(path, node_id=7, count=20, trim_to=5)
    before = _digest(path)
    wal = read_dead_wal(str(path), node_id=7)
    assert _digest(path) == before
    assert wal.node_id == 7
    assert [offset for offset, _ in wal.records] == offsets[5:]
    assert wal.records[-1][1] == encode_plain(StreamRecordBatch(1, 0, 19, 1, b"r19"))


async def test_a_wal_of_another_node_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "wal"
    await _write_wal(path, node_id=7, count=1)
    with pytest.raises(ConflictError, match="belongs to node 7"):
        read_dead_wal(str(path), node_id=8)


def test_a_missing_wal_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(UnavailableError):
        read_dead_wal(str(tmp_path / "none"), node_id=1)


def test_a_file_without_a_header_is_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "wal"
    path.write_bytes(bytes(1 << 16))
    with pytest.raises(CorruptionError):
        read_dead_wal(str(path), node_id=1)
