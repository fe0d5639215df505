"""Bad input gets a clear, typed error and loses nothing: the public surface under hostile input.

Each test is a finding of the errors audit (docs/architecture.md, "Errors"): before its fix the call
raised a bare Python or sqlite3 exception, answered with the wrong error kind, hung, or acted on a
mistyped path. Corrupt objects, WAL damage and bad arguments that already failed cleanly are covered
by their modules' own tests.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from s3stream.assembly import open_client
from s3stream.cli import main
from s3stream.config import Config
from s3stream.engine.client import Client
from s3stream.engine.pipeline import UploadObserver
from s3stream.errors import (
    ConflictError,
    CorruptionError,
    InvalidArgumentError,
    UnavailableError,
)
from s3stream.metadata.memory import MemoryMetadataStore
from s3stream.metadata.sqlite import SqliteMetadataStore
from s3stream.model import RecordBatch
from s3stream.storage.local import LocalObjectStorage
from s3stream.storage.memory import MemoryObjectStorage
from s3stream.storage.s3 import S3Config, S3ObjectStorage
from s3stream.storage.uri import open_storage, parse_bucket_uri
from tests.support.configs import small_config
from tests.support.faults import Fault, FaultPlan, FaultyObjectStorage

MiB = 1 << 20
CONFIG = small_config(close_timeout_ms=200)


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[Client]:
    """An engine on the memory twins of the metadata and object storage, the block WAL in tmp_path."""
    async with await open_client(
        tmp_path / "data", config=CONFIG, metadata=MemoryMetadataStore(), storage=MemoryObjectStorage()
    ) as c:
        yield c


# -- the async API ----------------------------------------------------------------------------------


async def test_append_atomic_kv_that_is_not_a_mapping_is_an_invalid_argument(client: Client) -> None:
    stream = await client.streams.create_and_open_stream()
    with pytest.raises(InvalidArgumentError, match="kv must be a mapping"):
        await client.append_atomic([(stream, RecordBatch(b"a"))], kv=[("k", b"v")])  # type: ignore[arg-type]
    assert stream.next_offset == 0, "nothing was appended"
    assert await stream.append(RecordBatch(b"b")) == 0


@pytest.mark.parametrize("appends", [None, "stream"])
async def test_append_atomic_appends_that_are_not_a_sequence_are_an_invalid_argument(
    client: Client, appends: Any
) -> None:
    stream = await client.streams.create_and_open_stream()
    with pytest.raises(InvalidArgumentError, match="appends must be a sequence"):
        await client.append_atomic(stream if appends == "stream" else appends)
    assert stream.next_offset == 0


@pytest.mark.parametrize("tags", ["ab", 5, [("a",)]])
async def test_stream_tags_that_are_not_a_mapping_are_an_invalid_argument(client: Client, tags: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="tags must be a mapping"):
        await client.streams.create_stream(tags=tags)
    assert await client.streams.list_streams() == []


# -- configuration ----------------------------------------------------------------------------------


def test_a_size_of_thousands_of_digits_is_above_the_maximum_not_a_bare_value_error() -> None:
    with pytest.raises(InvalidArgumentError, match=r"s3\.wal\.capacity = 9+\.\.\. is above its maximum"):
        Config.from_sources(env={"S3STREAM_S3_WAL_CAPACITY": "9" * 5000})


def test_a_size_in_non_ascii_digits_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="must be an integer"):
        Config.from_sources(
            env={"S3STREAM_S3_WAL_CAPACITY": "\uff11\uff12\uff13\uff14\uff15\uff16\uff17\uff18"}
        )


def test_config_replace_with_an_unknown_field_is_an_invalid_argument() -> None:
    with pytest.raises(InvalidArgumentError, match="unknown config field 'wal_capacity'"):
        Config().replace(wal_capacity=1)


def test_config_sources_of_the_wrong_type_are_an_invalid_argument() -> None:
    with pytest.raises(InvalidArgumentError, match="config file path must be a str or path, got int"):
        Config.from_sources(5)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="env must be a mapping"):
        Config.from_sources(env=5)  # type: ignore[arg-type]


# -- open ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("data_dir", [None, 5])
async def test_open_with_a_data_dir_that_is_not_a_path_is_an_invalid_argument(data_dir: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="data_dir must be a str or path"):
        await open_client(data_dir, config=CONFIG)


async def test_open_with_an_empty_data_dir_is_refused_rather_than_using_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InvalidArgumentError, match="data_dir is empty"):
        await open_client("", config=CONFIG)
    assert list(tmp_path.iterdir()) == [], "no WAL or metadata file was made in the working directory"


async def test_open_with_a_config_that_is_not_a_config_is_an_invalid_argument(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="config must be an s3stream Config"):
        await open_client(tmp_path, config={"s3.wal.capacity": 1})  # type: ignore[arg-type]


def test_a_bucket_uri_that_is_not_a_str_says_so() -> None:
    with pytest.raises(InvalidArgumentError, match="bucket URI must be a str, got int"):
        parse_bucket_uri(5)  # type: ignore[arg-type]


@pytest.mark.parametrize("endpoint", ["http://h:99999", "http://h:abc", "http://:80"])
def test_an_s3_endpoint_with_a_bad_port_or_no_host_is_refused_when_parsed(endpoint: str) -> None:
    """Before: accepted; every request then failed in aiohttp, which the retries took as transient."""
    with pytest.raises(InvalidArgumentError, match="endpoint"):
        open_storage(f"0@s3://b?endpoint={endpoint}")


async def test_paths_with_a_nul_byte_are_an_invalid_argument(tmp_path: Path) -> None:
    """Before: a bare ValueError ('embedded null byte') from the filesystem calls."""
    with pytest.raises(InvalidArgumentError, match="not a valid path"):
        open_storage(f"file://{tmp_path}/a\x00b")
    with pytest.raises(InvalidArgumentError, match="cannot create data dir"):
        await open_client(f"{tmp_path}/a\x00b", config=CONFIG)


def test_a_local_object_store_root_that_is_a_file_is_an_invalid_argument(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"x")
    with pytest.raises(InvalidArgumentError, match="is not a directory"):
        LocalObjectStorage(str(tmp_path / "file"))


async def test_s3_access_check_returns_an_unreachable_endpoint_as_transient() -> None:
    """A closed port: reported (the open goes on; appends do not need storage until the WAL fills)."""
    storage = S3ObjectStorage(
        S3Config(
            bucket="b", endpoint="http://127.0.0.1:1", access_key="a", secret_key="b", connect_timeout_s=1
        )
    )
    try:
        error = await storage.check_access()
    finally:
        await storage.close()
    assert isinstance(error, UnavailableError)
    assert "LIST s3://b/" in str(error)


async def test_open_with_an_unreachable_s3_endpoint_opens_and_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    uri = "0@s3://b?endpoint=http://127.0.0.1:1&region=us-east-1&pathStyle=true&accessKey=a&secretKey=b"
    client = await open_client(tmp_path, bucket_uri=uri, config=CONFIG, metadata=MemoryMetadataStore())
    await client.close()
    assert "storage.unreachable_at_open" in caplog.text


# -- one object storage, two metadata stores ----------------------------------------------------------


async def _write_records(data_dir: Path, bucket_uri: str, prefix: bytes, *, config: Config = CONFIG) -> int:
    async with await open_client(data_dir, bucket_uri=bucket_uri, config=config) as c:
        stream = await c.streams.create_and_open_stream()
        for i in range(3):
            await stream.append(RecordBatch(prefix + b"-%d" % i))
        await stream.close()
        return stream.stream_id


async def test_a_second_data_dir_on_the_same_bucket_is_refused_and_the_first_keeps_its_data(
    tmp_path: Path,
) -> None:
    """Before: the second data dir's object ids started at 0 too and its uploads overwrote the first's
    objects: the first data dir then fetched the second's records as its own."""
    bucket = f"file://{tmp_path / 'bucket'}"
    stream_id = await _write_records(tmp_path / "a", bucket, b"A")
    with pytest.raises(ConflictError, match="already holds objects of namespace 's3stream'"):
        await _write_records(tmp_path / "b", bucket, b"B")
    async with await open_client(tmp_path / "a", bucket_uri=bucket, config=CONFIG) as c:
        stream = await c.streams.open_stream(stream_id, epoch=1)
        assert [b.payload for b in await stream.fetch(0, 3)] == [b"A-0", b"A-1", b"A-2"]


async def test_a_data_dir_whose_metadata_was_lost_refuses_its_objects(tmp_path: Path) -> None:
    """A fresh metadata store must not adopt (nor, through its orphan scan, delete) the objects."""
    bucket = f"file://{tmp_path / 'bucket'}"
    await _write_records(tmp_path / "a", bucket, b"A")
    objects = sorted(p for p in (tmp_path / "bucket").rglob("*") if p.is_file())
    (tmp_path / "a" / "metadata.db").unlink()
    with pytest.raises(ConflictError, match="this data dir's metadata was lost"):
        await open_client(tmp_path / "a", bucket_uri=bucket, config=CONFIG)
    assert sorted(p for p in (tmp_path / "bucket").rglob("*") if p.is_file()) == objects


async def test_data_dirs_with_their_own_namespace_share_a_bucket(tmp_path: Path) -> None:
    bucket = f"file://{tmp_path / 'bucket'}"
    await _write_records(tmp_path / "a", bucket, b"A")
    other = CONFIG.replace(namespace="other")
    stream_id = await _write_records(tmp_path / "b", bucket, b"B", config=other)
    async with await open_client(tmp_path / "b", bucket_uri=bucket, config=other) as c:
        stream = await c.streams.open_stream(stream_id, epoch=1)
        assert [b.payload for b in await stream.fetch(0, 3)] == [b"B-0", b"B-1", b"B-2"]


async def test_a_bound_data_dir_opens_after_all_its_streams_are_destroyed(tmp_path: Path) -> None:
    bucket = f"file://{tmp_path / 'bucket'}"
    async with await open_client(tmp_path / "a", bucket_uri=bucket, config=CONFIG) as c:
        stream = await c.streams.create_and_open_stream()
        await stream.append(RecordBatch(b"x"))
        await stream.destroy()
        assert await c.streams.list_streams() == []
    async with await open_client(tmp_path / "a", bucket_uri=bucket, config=CONFIG) as c:
        assert await c.streams.list_streams() == []


async def test_kv_keys_of_the_engine_are_reserved(client: Client) -> None:
    with pytest.raises(InvalidArgumentError, match="are reserved"):
        await client.kv.get("\x00s3stream.storage.bound")
    with pytest.raises(InvalidArgumentError, match="are reserved"):
        await client.kv.put("\x00s3stream.anything", b"v")
    assert await client.kv.put("\x00other", b"v") == b"v"


# -- storage that does not answer: closes and opens give up with a typed error ----------------------


class BlockedUploads(UploadObserver):
    """Uploads wait before writing until ``release`` is set (object storage that does not answer)."""

    def __init__(self) -> None:
        self.release = asyncio.Event()

    async def before_upload(self) -> None:
        await self.release.wait()


async def test_stream_close_gives_up_after_the_close_timeout_and_loses_nothing(tmp_path: Path) -> None:
    hooks = BlockedUploads()
    client = await open_client(
        tmp_path,
        config=CONFIG,
        upload_observer=hooks,
        metadata=MemoryMetadataStore(),
        storage=MemoryObjectStorage(),
    )
    try:
        stream = await client.streams.create_and_open_stream()
        await stream.append(RecordBatch(b"kept", count=2))
        with pytest.raises(
            UnavailableError,
            match=r"close gave up after s3\.close\.timeout\.ms \(200 ms\) .* storage is slow",
        ):
            await asyncio.wait_for(stream.close(), 10)
        assert [b.payload for b in await stream.fetch(0, 2)] == [b"kept"], "still readable while closing"
        with pytest.raises(ConflictError, match="still closing"):
            await client.streams.open_stream(stream.stream_id, epoch=1)
        hooks.release.set()
        await asyncio.wait_for(stream.close(), 10)
        reopened = await client.streams.open_stream(stream.stream_id, epoch=1)
        assert reopened.confirm_offset == 2
        assert [b.payload for b in await reopened.fetch(0, 2)] == [b"kept"]
    finally:
        hooks.release.set()
        await client.close()


async def test_a_close_timeout_quotes_the_failing_upload_step(tmp_path: Path) -> None:
    """Storage that refuses every write: the error says why the upload does not get through."""
    storage = FaultyObjectStorage(MemoryObjectStorage(), FaultPlan([Fault("*")]))
    client = await open_client(tmp_path, config=CONFIG, metadata=MemoryMetadataStore(), storage=storage)
    try:
        stream = await client.streams.create_and_open_stream()
        await stream.append(RecordBatch(b"kept"))
        with pytest.raises(UnavailableError, match=r"uploads are failing, retried: upload: .*injected fault"):
            await asyncio.wait_for(stream.close(), 10)
        assert [b.payload for b in await stream.fetch(0, 1)] == [b"kept"]
    finally:
        await client.close()


async def test_open_gives_up_on_failing_replay_uploads_after_the_close_timeout(tmp_path: Path) -> None:
    """Before: the open waited for the replayed records' upload forever (storage down = a hang)."""
    plan = FaultPlan([Fault("*")], enabled=False)
    storage = FaultyObjectStorage(LocalObjectStorage(str(tmp_path / "objects")), plan)
    first = await open_client(tmp_path, config=CONFIG, storage=storage)
    stream = await first.streams.create_and_open_stream()
    await stream.append(RecordBatch(b"acknowledged"))
    first.engine.abandon()  # a crash: the record is only in the WAL
    for closer in first._closers:
        await closer()

    plan.enabled = True
    storage = FaultyObjectStorage(LocalObjectStorage(str(tmp_path / "objects")), plan)
    with pytest.raises(
        UnavailableError, match=r"open gave up uploading the 1 record batches .*injected fault"
    ):
        await asyncio.wait_for(open_client(tmp_path, config=CONFIG, storage=storage), 30)

    async with await open_client(tmp_path, config=CONFIG) as again:
        reopened = await again.streams.open_stream(stream.stream_id, epoch=1)
        assert [b.payload for b in await reopened.fetch(0, 1)] == [b"acknowledged"]


async def test_open_waits_for_slow_replay_uploads_past_the_close_timeout(tmp_path: Path) -> None:
    """Storage that answers slowly but without failing is waited for (a short close timeout must not
    make every open after a crash fail)."""
    first = await open_client(tmp_path, config=CONFIG)
    stream = await first.streams.create_and_open_stream()
    await stream.append(RecordBatch(b"acknowledged"))
    first.engine.abandon()
    for closer in first._closers:
        await closer()

    hooks = BlockedUploads()
    opening = asyncio.ensure_future(open_client(tmp_path, config=CONFIG, upload_observer=hooks))
    await asyncio.sleep(3 * CONFIG.close_timeout_ms / 1000)
    assert not opening.done()
    hooks.release.set()
    async with await asyncio.wait_for(opening, 30) as again:
        reopened = await again.streams.open_stream(stream.stream_id, epoch=1)
        assert [b.payload for b in await reopened.fetch(0, 1)] == [b"acknowledged"]


# -- the SQLite metadata file -------------------------------------------------------------------------


async def _metadata_file(path: Path) -> None:
    store = await SqliteMetadataStore.open(path)
    await store.register_node(node_id=0, node_epoch=1)
    await store.create_stream(node_id=0, node_epoch=1, tags={"a": "b"})
    await store.close()


def _raw_sql(path: Path, *statements: str) -> None:
    conn = sqlite3.connect(path)
    try:
        for statement in statements:
            conn.execute(statement)
        conn.commit()
    finally:
        conn.close()


async def test_metadata_text_that_is_not_utf8_is_corruption(tmp_path: Path) -> None:
    """Before: sqlite3's OperationalError for it became UnavailableError (retriable)."""
    path = tmp_path / "metadata.db"
    await _metadata_file(path)
    _raw_sql(path, "UPDATE streams SET tags = CAST(X'7b2261223aff7d' AS TEXT)")
    store = await SqliteMetadataStore.open(path)
    try:
        with pytest.raises(CorruptionError, match="not UTF-8") as info:
            await store.list_streams()
        assert info.value.source == str(path)
    finally:
        await store.close()


async def test_a_damaged_column_name_in_the_metadata_schema_is_corruption_at_open(tmp_path: Path) -> None:
    """quick_check does not read the schema text; before, the file opened and every statement naming
    the column failed later with "no such column" as UnavailableError."""
    path = tmp_path / "metadata.db"
    await _metadata_file(path)
    _raw_sql(
        path,
        "PRAGMA writable_schema = ON",
        "UPDATE sqlite_master SET sql = replace(sql, 'committed_at_ms', 'committed_at_mz') WHERE name = 'objects'",
    )
    with pytest.raises(CorruptionError, match="differs in: table objects"):
        await SqliteMetadataStore.open(path)


async def test_schema_text_that_is_not_utf8_is_corruption_at_open(tmp_path: Path) -> None:
    path = tmp_path / "metadata.db"
    await _metadata_file(path)
    _raw_sql(
        path,
        "PRAGMA writable_schema = ON",
        "UPDATE sqlite_master SET sql = replace(sql, 'committed_at_ms', CAST(X'636fff' AS TEXT)) "
        "WHERE name = 'objects'",
    )
    with pytest.raises(CorruptionError, match="not UTF-8"):
        await SqliteMetadataStore.open(path)


async def test_a_non_utf8_byte_in_an_index_name_is_corruption_at_open(tmp_path: Path) -> None:
    """A flipped high bit in the schema page: quick_check's report quotes the damaged name, which is
    not UTF-8 (before: a bare UnicodeDecodeError from the open)."""
    path = tmp_path / "metadata.db"
    await _metadata_file(path)
    data = bytearray(path.read_bytes())
    name = b"stream_set_ranges_by_stream"
    at = data.find(name)
    assert at > 0
    data[at + 3] ^= 0x80
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptionError):
        await SqliteMetadataStore.open(path)


# -- the command line ---------------------------------------------------------------------------------


CLI_CONFIG = """
"s3.wal.capacity" = "8MiB"
"s3.wal.record.size.max" = "1MiB"
"s3.record.size.max" = "512KiB"
"s3.wal.cache.size" = "4MiB"
"s3.wal.upload.threshold" = "1MiB"
"""


@pytest.fixture
def config_file(tmp_path: Path) -> str:
    path = tmp_path / "s3stream.toml"
    path.write_text(CLI_CONFIG)
    return str(path)


@pytest.mark.parametrize("command", [["streams"], ["objects"], ["fetch", "--stream", "0"], ["compact"]])
def test_read_commands_on_a_missing_data_dir_fail_without_creating_it(
    tmp_path: Path, config_file: str, command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "typo"
    assert main([*command, "--data-dir", str(missing), "--config", config_file]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err == f"s3stream {command[0]}: error: no data dir at {missing} (--data-dir, or $S3STREAM_DATA_DIR)"
    )
    assert not missing.exists()


def test_produce_with_a_size_above_the_record_maximum_fails_at_once(
    tmp_path: Path, config_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: it generated a payload of --size bytes first (1e12: a hang), byte by byte."""
    argv = ["produce", "--data-dir", str(tmp_path / "d"), "--config", config_file, "--size", str(10**12)]
    assert main(argv) == 2
    assert "--size 1000000000000 is above s3.record.size.max (524288)" in capsys.readouterr().err


def test_fetch_from_beyond_the_end_is_out_of_range(
    tmp_path: Path, config_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: an empty table and exit 0, where the API raises OffsetOutOfRangeError."""
    args = ["--data-dir", str(tmp_path / "d"), "--config", config_file]
    assert main(["produce", *args, "--count", "3"]) == 0
    capsys.readouterr()
    assert main(["fetch", *args, "--stream", "0", "--start", "3"]) == 0, "at the end: nothing new"
    capsys.readouterr()
    assert main(["fetch", *args, "--stream", "0", "--start", "100"]) == 2
    assert "--start 100 is beyond stream 0's confirm offset 3" in capsys.readouterr().err
