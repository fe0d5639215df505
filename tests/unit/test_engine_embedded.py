"""The embedded default on real files: WAL file, local object store, SQLite; bucket URIs; the WAL lock."""

from __future__ import annotations

from pathlib import Path

import pytest

import s3stream
from s3stream import Config, ConflictError, RecordBatch
from s3stream.ids import NodeId

CONFIG = Config(wal_capacity_bytes=8 << 20, wal_record_max_bytes=1 << 20, record_max_bytes=1 << 20)


async def test_one_line_open_creates_the_layout_and_survives_reopen(tmp_path: Path) -> None:
    async with await s3stream.open(tmp_path, config=CONFIG) as client:
        stream = await client.streams.create_and_open_stream(tags={"topic": "t"})
        for i in range(20):
            await stream.append(RecordBatch(b"r%d" % i))
        sid = stream.stream_id
    assert (tmp_path / "wal").is_file()
    assert (tmp_path / "metadata.db").is_file()
    assert any((tmp_path / "objects").rglob("*"))
    async with await s3stream.open(tmp_path, config=CONFIG) as client:
        (meta,) = await client.streams.list_streams()
        assert (meta.stream_id, meta.end_offset, dict(meta.tags)) == (sid, 20, {"topic": "t"})
        stream = await client.streams.open_stream(sid, epoch=1)
        client.engine.cache.try_real_free(target_bytes=0)
        assert [b.payload for b in await stream.fetch(0, 20)] == [b"r%d" % i for i in range(20)]


async def test_a_second_open_of_the_same_data_dir_is_refused(tmp_path: Path) -> None:
    client = await s3stream.open(tmp_path, config=CONFIG)
    with pytest.raises(ConflictError, match="in use"):
        await s3stream.open(tmp_path, config=CONFIG)
    await client.close()
    again = await s3stream.open(tmp_path, config=CONFIG)
    await again.close()


@pytest.mark.parametrize("scheme", ["file", "mem"])
async def test_bucket_uri_puts_objects_elsewhere(tmp_path: Path, scheme: str) -> None:
    bucket = tmp_path / "bucket"
    uri = f"file://{bucket}" if scheme == "file" else f"mem://engine-test-{tmp_path.name}"
    async with await s3stream.open(tmp_path / "data", bucket_uri=uri, config=CONFIG) as client:
        stream = await client.streams.create_and_open_stream()
        await stream.append(RecordBatch(b"x"))
        await stream.close()
        assert client.engine.stats.uploads == 1
    assert not (tmp_path / "data" / "objects").exists()
    if scheme == "file":
        assert any(bucket.rglob("*"))


async def test_wal_capacity_cannot_change_after_creation(tmp_path: Path) -> None:
    await (await s3stream.open(tmp_path, config=CONFIG)).close()
    with pytest.raises(s3stream.InvalidArgumentError, match="capacity"):
        await s3stream.open(tmp_path, config=CONFIG.replace(wal_capacity_bytes=16 << 20))


async def test_the_embedded_client_runs_the_compactor_and_data_survives_a_compaction(tmp_path: Path) -> None:
    from compaction.compactor import Compactor

    async with await s3stream.open(tmp_path, config=CONFIG) as client:
        streams = [await client.streams.create_and_open_stream() for _ in range(3)]
        for round_ in range(3):  # three uploads -> three StreamSet objects to merge
            for s in streams:
                await s.append(RecordBatch(b"%d-%d" % (s.stream_id, round_)))
            await client.engine.force_upload(None)
        compactor = client.components["compactor"]
        assert isinstance(compactor, Compactor)
        metadata = client.engine.metadata
        assert len(await metadata.get_stream_set_objects(NodeId(0))) == 3
        await compactor.run_once()
        assert len(await metadata.get_stream_set_objects(NodeId(0))) < 3
        client.engine.cache.try_real_free(target_bytes=0)
        for s in streams:
            got = await s.fetch(0, 3)
            assert [b.payload for b in got] == [b"%d-%d" % (s.stream_id, r) for r in range(3)]
