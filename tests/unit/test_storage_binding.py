"""A data dir remembers its object storage, and a failed first open leaves nothing behind
(s3stream/binding.py, s3stream/assembly.py)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

import s3stream
from s3stream import Config, ConflictError, RecordBatch
from s3stream.binding import (
    STORAGE_BOUND_KEY,
    RecordedStorage,
    read_recorded_storage,
    storage_to_open,
    without_secrets,
)
from s3stream.engine.core import Engine
from s3stream.metadata.sqlite import SqliteMetadataStore
from s3stream.storage.local import LocalObjectStorage

CONFIG = Config(wal_capacity_bytes=8 << 20, wal_record_max_bytes=1 << 20, record_max_bytes=1 << 20)


async def write_one_record(data_dir: Path, bucket_uri: str | None = None) -> None:
    async with await s3stream.open(data_dir, bucket_uri=bucket_uri, config=CONFIG) as client:
        stream = await client.streams.create_and_open_stream()
        await stream.append(RecordBatch(b"x"))
        await stream.close()


async def test_a_data_dir_created_on_a_bucket_reopens_there_without_a_bucket_uri(tmp_path: Path) -> None:
    bucket, data_dir = tmp_path / "bucket", tmp_path / "data"
    await write_one_record(data_dir, f"file://{bucket}")
    async with await s3stream.open(data_dir, config=CONFIG) as client:
        storage = client.engine.storage
        assert isinstance(storage, LocalObjectStorage)
        assert storage.root == bucket
        (meta,) = await client.streams.list_streams()
        stream = await client.streams.open_stream(meta.stream_id, epoch=1)
        client.engine.cache.try_real_free(target_bytes=0)
        assert [b.payload for b in await stream.fetch(0, 1)] == [b"x"]
        await stream.append(RecordBatch(b"y"))
        await stream.close()
    assert not (data_dir / "objects").exists()  # nothing uploaded into a second store


async def test_a_different_bucket_is_refused_naming_both(tmp_path: Path) -> None:
    await write_one_record(tmp_path / "data", f"file://{tmp_path / 'one'}")
    with pytest.raises(ConflictError) as caught:
        await s3stream.open(tmp_path / "data", bucket_uri=f"file://{tmp_path / 'two'}", config=CONFIG)
    assert str(tmp_path / "one") in str(caught.value)
    assert str(tmp_path / "two") in str(caught.value)
    assert not (tmp_path / "two").exists()


async def test_a_local_data_dir_refuses_a_bucket_uri(tmp_path: Path) -> None:
    await write_one_record(tmp_path / "data")
    with pytest.raises(ConflictError, match="objects/ folder"):
        await s3stream.open(tmp_path / "data", bucket_uri=f"file://{tmp_path / 'bucket'}", config=CONFIG)
    assert read_recorded_storage(tmp_path / "data") == RecordedStorage(None, CONFIG.namespace)


async def test_another_namespace_is_refused(tmp_path: Path) -> None:
    await write_one_record(tmp_path / "data")
    with pytest.raises(ConflictError, match="namespace"):
        await s3stream.open(tmp_path / "data", config=CONFIG.replace(namespace="other"))


def test_the_recorded_uri_keeps_the_storage_and_drops_the_credentials() -> None:
    uri = (
        "0@s3://bucket?region=eu-west-1&endpoint=http://h:7480&pathStyle=true&accessKey=AK"
        "&secretKey=SK&prefix=p/&partSizeBytes=8388608"
    )
    recorded = without_secrets(uri)
    assert "AK" not in recorded
    assert "SK" not in recorded
    assert recorded == (
        "s3://bucket?region=eu-west-1&endpoint=http%3A%2F%2Fh%3A7480&pathStyle=true&prefix=p%2F"
        "&partSizeBytes=8388608"
    )
    record = RecordedStorage(recorded, "ns")
    assert storage_to_open(record, None, namespace="ns") == recorded
    # other credentials or client settings: the same storage
    same = "s3://bucket?endpoint=http://h:7480/&prefix=p&accessKey=X&secretKey=Y&partSizeBytes=5242880"
    assert storage_to_open(record, same, namespace="ns") == same
    for other in (
        "s3://bucket?endpoint=http://h:7480&prefix=q/",
        "s3://other?endpoint=http://h:7480&prefix=p/",
    ):
        with pytest.raises(ConflictError):
            storage_to_open(record, other, namespace="ns")


async def test_read_recorded_storage_writes_nothing(tmp_path: Path) -> None:
    assert read_recorded_storage(tmp_path / "missing") is None
    assert not (tmp_path / "missing").exists()
    await write_one_record(tmp_path / "data", "mem://binding-read-test")
    before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (tmp_path / "data").iterdir()}
    record = read_recorded_storage(tmp_path / "data")
    assert record == RecordedStorage("mem://binding-read-test", CONFIG.namespace)
    after = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (tmp_path / "data").iterdir()}
    assert after == before


async def test_read_recorded_storage_works_while_the_data_dir_is_open(tmp_path: Path) -> None:
    async with await s3stream.open(tmp_path, config=CONFIG):
        assert read_recorded_storage(tmp_path) == RecordedStorage(None, CONFIG.namespace)


async def test_a_data_dir_bound_before_the_record_keeps_opening_with_any_storage(tmp_path: Path) -> None:
    await write_one_record(tmp_path / "data", "mem://binding-old-test")
    metadata = await SqliteMetadataStore.open(tmp_path / "data" / "metadata.db")
    await metadata.kv_put(STORAGE_BOUND_KEY, b"1")  # what data dirs held before the record
    await metadata.close()
    assert read_recorded_storage(tmp_path / "data") is None
    async with await s3stream.open(tmp_path / "data", bucket_uri="mem://binding-old-test", config=CONFIG):
        pass
    async with await s3stream.open(tmp_path / "data", config=CONFIG):
        pass
    assert read_recorded_storage(tmp_path / "data") is None


async def test_a_failed_first_open_leaves_no_data_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def fail(self: Engine) -> None:
        raise s3stream.UnavailableError("injected start failure")

    monkeypatch.setattr(Engine, "start", fail)
    with pytest.raises(s3stream.UnavailableError, match="injected"):
        await s3stream.open(tmp_path / "a" / "data", config=CONFIG)
    assert list(tmp_path.iterdir()) == []


async def test_a_failed_open_of_an_existing_data_dir_removes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await write_one_record(tmp_path)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))

    async def fail(self: Engine) -> None:
        raise s3stream.UnavailableError("injected start failure")

    monkeypatch.setattr(Engine, "start", fail)
    with pytest.raises(s3stream.UnavailableError, match="injected"):
        await s3stream.open(tmp_path, config=CONFIG)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


async def test_a_data_dir_from_before_the_binding_is_bound_without_recording_a_storage(
    tmp_path: Path,
) -> None:
    await write_one_record(tmp_path / "data", "mem://binding-older-test")
    metadata = await SqliteMetadataStore.open(tmp_path / "data" / "metadata.db")
    await metadata.kv_delete(STORAGE_BOUND_KEY)  # data dirs older than the binding held no key
    await metadata.close()
    async with await s3stream.open(tmp_path / "data", config=CONFIG):
        pass  # its objects may be anywhere: the storage of this open is not recorded as its own
    assert read_recorded_storage(tmp_path / "data") is None
    metadata = await SqliteMetadataStore.open(tmp_path / "data" / "metadata.db")
    assert await metadata.kv_get(STORAGE_BOUND_KEY) == b"1"
    await metadata.close()


async def test_storage_that_did_not_answer_at_the_first_open_is_recorded_unchecked(tmp_path: Path) -> None:
    uri = (
        "s3://bucket?endpoint=http://127.0.0.1:9&pathStyle=true&accessKey=a&secretKey=b&apiCallTimeoutMs=500"
    )
    config = CONFIG.replace(upload_retry_backoff_ms=20, metadata_copy_wait_ms=1_000)
    async with await s3stream.open(tmp_path, bucket_uri=uri, config=config):
        pass
    assert read_recorded_storage(tmp_path) == RecordedStorage(
        without_secrets(uri), CONFIG.namespace, checked=False
    )
