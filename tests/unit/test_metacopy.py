"""The metadata copy with a real SQLite store and the in-memory object storage: what the replicator
uploads, when operations return, and what restore rebuilds from it (gaps, damage, pruning)."""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from s3stream.errors import ConflictError, InvalidArgumentError, UnavailableError
from s3stream.ids import NodeId
from s3stream.metacopy.objects import (
    copies_prefix,
    decode_log,
    decode_snapshot,
    encode_log,
    log_key,
    parse_copy_key,
)
from s3stream.metacopy.replicator import MetadataCopy
from s3stream.metacopy.restore import restore
from s3stream.metadata import sqlite_copy
from s3stream.metadata.base import CommitStreamSetObjectRequest, StreamOffsetRange
from s3stream.metadata.sqlite import SqliteMetadataStore
from s3stream.objectformat import parse_object_key
from s3stream.storage.base import ObjectInfo, Upload
from s3stream.storage.memory import MemoryObjectStorage
from tests.support.metacopy_replay import replay_uncopied

NS = "ns"
NODE = NodeId(1)
COPY_TABLES = {"copy_state", "pending_copy", "schema_version"}


class FlakyStorage:
    """The in-memory storage whose PUTs fail while ``down`` is set (a bucket that does not answer),
    only those of keys containing ``down_only`` when that is set."""

    def __init__(self, inner: MemoryObjectStorage) -> None:
        self.inner = inner
        self.down = False
        self.down_only = ""

    async def put(self, key: str, data: bytes | bytearray | memoryview, *, if_absent: bool = False) -> None:
        if self.down and self.down_only in key:
            raise UnavailableError(f"PUT {key}: the test bucket is down")
        await self.inner.put(key, data, if_absent=if_absent)

    def upload(self, key: str, *, buffer_max_bytes: int | None = None) -> Upload:
        return self.inner.upload(key, buffer_max_bytes=buffer_max_bytes)

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        return await self.inner.get(key, start, end)

    async def head(self, key: str) -> ObjectInfo:
        return await self.inner.head(key)

    async def delete(self, keys: Sequence[str]) -> None:
        await self.inner.delete(keys)

    def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        return self.inner.list(prefix)

    async def close(self) -> None:
        await self.inner.close()


def dump(path: Path) -> dict[str, list[tuple[object, ...]]]:
    """Every metadata table's rows (the copy's own tables left out)."""
    conn = sqlite3.connect(path)
    try:
        names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {
            name: sorted(conn.execute(f"SELECT * FROM {name}").fetchall(), key=repr)
            for name in names
            if name not in COPY_TABLES
        }
    finally:
        conn.close()


async def first_snapshot(storage: MemoryObjectStorage) -> None:
    """Wait for the copy's first snapshot (taken in the background after ``start``), and nothing else."""
    for _ in range(500):
        if await keys(storage):
            break
        await asyncio.sleep(0.01)
    assert [parse_copy_key(NS, k).kind for k in await keys(storage)] == ["snapshot"]  # type: ignore[union-attr]


async def keys(storage: MemoryObjectStorage) -> list[str]:
    return [info.key async for info in storage.list(copies_prefix(NS))]


async def work(store: SqliteMetadataStore, rounds: int) -> None:
    """Metadata operations of every kind: nodes, streams, ranges, objects, commits, trims, KV."""
    await store.register_node(node_id=NODE, node_epoch=5)
    for r in range(rounds):
        sid = await store.create_stream(node_id=NODE, node_epoch=5, tags={"round": str(r)})
        await store.open_stream(node_id=NODE, node_epoch=5, stream_id=sid, epoch=0)
        oid = await store.prepare_objects(count=1, ttl_ms=60_000)
        await store.commit_stream_set_object(
            CommitStreamSetObjectRequest(NODE, 5, oid, oid, 100, (StreamOffsetRange(sid, 0, 10, 100),))
        )
        await store.trim_stream(node_id=NODE, node_epoch=5, stream_id=sid, epoch=0, new_start_offset=3)
        await store.kv_put(f"k{r}", b"v%d" % r)
        if r % 3 == 2:
            await store.kv_delete(f"k{r - 1}")
    await store.prepare_objects(count=2, ttl_ms=60_000)  # left PREPARED


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteMetadataStore]:
    (tmp_path / "a").mkdir()
    s = await SqliteMetadataStore.open(tmp_path / "a" / "metadata.db")
    yield s
    await s.close()


async def test_the_copy_starts_with_a_snapshot_and_each_write_returns_once_its_log_is_uploaded(
    store: SqliteMetadataStore,
) -> None:
    storage = MemoryObjectStorage()
    copy = MetadataCopy(store, storage, namespace=NS)
    await copy.start()
    try:
        await first_snapshot(storage)
        await store.kv_put("a", b"1")
        assert copy.copied_seq == 1  # returned only after its group was uploaded
        found = await keys(storage)
        assert [parse_copy_key(NS, k).kind for k in found] == ["log", "snapshot"]  # type: ignore[union-attr]
        log = next(k for k in found if "/log/" in k)
        assert log == log_key(copy.prefix, 1, 1)
        assert [seq for seq, _ in decode_log(await storage.get(log), source=log)] == [1]
        state = await store.copy_state()
        assert state is not None
        assert state.pending_first_seq is None  # deleted locally once uploaded
        for key in found:  # never taken for an object of the namespace (orphan scan, binding check)
            with pytest.raises(InvalidArgumentError):
                parse_object_key(key)
    finally:
        await copy.close()


async def test_restore_rebuilds_every_table_from_snapshot_and_logs(
    store: SqliteMetadataStore, tmp_path: Path
) -> None:
    storage = MemoryObjectStorage()
    copy = MetadataCopy(store, storage, namespace=NS)
    await copy.start()
    try:
        await first_snapshot(storage)  # so the snapshot holds no node (sessions are not logged)
        await work(store, 6)
    finally:
        await copy.close()
    report = await restore(storage, namespace=NS, data_dir=tmp_path / "b", kv_overrides={"bound": b"x"})
    state = await store.copy_state()
    assert state is not None
    assert report.stopped is None
    assert report.last_seq == state.next_seq - 1
    assert report.snapshot_seq == 0
    assert report.last_commit_ms == state.last_commit_ms
    expected = dump(tmp_path / "a" / "metadata.db")
    expected["kv"] = sorted([*expected["kv"], ("bound", b"x")], key=repr)
    got = dump(tmp_path / "b" / "metadata.db")
    # node sessions and leases are not logged (sqlite_copy.SESSION_CHANGES): the restored tables hold
    # them as of the snapshot, taken here before the node registered
    assert got.pop("nodes") == []
    assert got.pop("leases") == []
    assert expected.pop("nodes") != []
    expected.pop("leases")
    assert got == expected
    assert (report.streams, report.committed_objects, report.kv_pairs) == (6, 6, len(expected["kv"]))
    restored = await SqliteMetadataStore.open(tmp_path / "b" / "metadata.db")
    try:
        assert await restored.copy_state() is None  # a restored data dir starts a copy of its own
        assert [s.end_offset for s in await restored.list_streams()] == [10] * 6
    finally:
        await restored.close()


async def test_snapshots_prune_old_objects_and_restore_uses_the_newest(
    store: SqliteMetadataStore, tmp_path: Path
) -> None:
    storage = MemoryObjectStorage()
    copy = MetadataCopy(store, storage, namespace=NS, snapshot_every_groups=10)
    await copy.start()
    try:
        await work(store, 12)
        await asyncio.sleep(0.3)
    finally:
        await copy.close()
    parsed = [parse_copy_key(NS, k) for k in await keys(storage)]
    snapshots = sorted(p.last_seq for p in parsed if p is not None and p.kind == "snapshot")
    assert len(snapshots) == 2
    assert copy.stats["snapshots"] >= 5
    assert all(p.last_seq > snapshots[0] for p in parsed if p is not None and p.kind == "log")
    report = await restore(storage, namespace=NS, data_dir=tmp_path / "b")
    assert report.snapshot_seq == snapshots[1]
    assert report.stopped is None
    assert dump(tmp_path / "b" / "metadata.db") == dump(tmp_path / "a" / "metadata.db")


async def test_a_damaged_newest_snapshot_falls_back_to_the_one_before(
    store: SqliteMetadataStore, tmp_path: Path
) -> None:
    storage = MemoryObjectStorage()
    copy = MetadataCopy(store, storage, namespace=NS, snapshot_every_groups=10)
    await copy.start()
    try:
        await work(store, 8)
    finally:
        await copy.close()
    snaps = sorted(k for k in await keys(storage) if "/snapshot/" in k)
    data = bytearray(await storage.get(snaps[-1]))
    data[len(data) // 2] ^= 1
    await storage.put(snaps[-1], bytes(data))
    report = await restore(storage, namespace=NS, data_dir=tmp_path / "b")
    assert report.snapshot_key == snaps[0]
    assert report.skipped[0].startswith(snaps[-1])
    assert "CRC32C" in report.skipped[0]
    assert report.stopped is None
    assert dump(tmp_path / "b" / "metadata.db") == dump(tmp_path / "a" / "metadata.db")


async def test_groups_a_snapshot_holds_still_reach_a_log_object(
    store: SqliteMetadataStore, tmp_path: Path
) -> None:
    """A snapshot taken while groups are pending does not drop them: with that snapshot damaged, the
    one before it plus the logs still restore everything."""
    flaky = FlakyStorage(MemoryObjectStorage())
    copy = MetadataCopy(store, flaky, namespace=NS)  # type: ignore[arg-type]
    await copy.start()
    try:
        await first_snapshot(flaky.inner)
        flaky.down, flaky.down_only = True, "/log/"  # the log upload of the next group retries
        pending = asyncio.create_task(store.kv_put("held", b"1"))
        await asyncio.sleep(0.1)
        await copy._snapshot()  # a snapshot holding the pending group, before its log upload
        state = await store.copy_state()
        assert state is not None
        assert state.pending_first_seq == 1  # still pending: it goes to a log too
        flaky.down = False
        await pending  # returned at the snapshot
        for _ in range(500):
            if log_key(copy.prefix, 1, 1) in await keys(flaky.inner):
                break
            await asyncio.sleep(0.01)
    finally:
        await copy.close()
    found = await keys(flaky.inner)
    snaps = sorted(k for k in found if "/snapshot/" in k)
    assert len(snaps) == 2
    assert log_key(copy.prefix, 1, 1) in found
    data = bytearray(await flaky.inner.get(snaps[-1]))
    data[len(data) // 2] ^= 1
    await flaky.inner.put(snaps[-1], bytes(data))
    report = await restore(flaky.inner, namespace=NS, data_dir=tmp_path / "b")
    assert report.snapshot_key == snaps[0]
    assert report.stopped is None
    assert report.last_seq == 1
    assert dump(tmp_path / "b" / "metadata.db") == dump(tmp_path / "a" / "metadata.db")


async def test_restore_stops_at_a_missing_log_object_and_names_the_group(
    store: SqliteMetadataStore, tmp_path: Path
) -> None:
    storage = MemoryObjectStorage()
    copy = MetadataCopy(store, storage, namespace=NS)
    await copy.start()
    try:
        await store.kv_put("a", b"1")  # group 1
        await store.kv_put("b", b"2")  # group 2
        await store.kv_put("c", b"3")  # group 3
    finally:
        await copy.close()
    await storage.delete([log_key(copy.prefix, 2, 2)])
    report = await restore(storage, namespace=NS, data_dir=tmp_path / "b")
    assert report.last_seq == 1
    assert report.stopped is not None
    assert "group 2 is in no log object" in report.stopped
    assert dump(tmp_path / "b" / "metadata.db")["kv"] == [("a", b"1")]


async def test_restore_stops_at_a_damaged_log_object_unless_another_holds_its_groups(
    store: SqliteMetadataStore, tmp_path: Path
) -> None:
    storage = MemoryObjectStorage()
    copy = MetadataCopy(store, storage, namespace=NS)
    await copy.start()
    try:
        for i in range(3):
            await store.kv_put(f"k{i}", b"v")  # groups 1, 2, 3
    finally:
        await copy.close()
    key = log_key(copy.prefix, 2, 2)
    good = await storage.get(key)
    await storage.put(key, good[:-1] + bytes([good[-1] ^ 0xFF]))
    report = await restore(storage, namespace=NS, data_dir=tmp_path / "b")
    assert report.last_seq == 1
    assert report.stopped is not None
    assert "group 2 is only in damaged log objects" in report.stopped
    assert key in report.stopped
    # a process killed between its PUT and deleting the rows uploads the same groups again, batched
    # differently: restore reads whichever copy of a group is intact
    entries = decode_log(good, source=key) + decode_log(
        await storage.get(log_key(copy.prefix, 3, 3)), source="3"
    )
    await storage.put(log_key(copy.prefix, 2, 3), encode_log([(s, bytes(g)) for s, g in entries]))
    report = await restore(storage, namespace=NS, data_dir=tmp_path / "c")
    assert (report.last_seq, report.stopped) == (3, None)
    assert dump(tmp_path / "c" / "metadata.db") == dump(tmp_path / "a" / "metadata.db")


async def test_while_the_bucket_is_down_writes_time_out_and_their_changes_are_copied_later(
    store: SqliteMetadataStore, tmp_path: Path
) -> None:
    memory = MemoryObjectStorage()
    storage = FlakyStorage(memory)
    copy = MetadataCopy(store, storage, namespace=NS, wait_timeout_ms=2_000)
    await copy.start()
    try:
        await store.kv_put("before", b"1")
        storage.down = True
        with pytest.raises(UnavailableError, match="committed locally but not yet in the bucket"):
            await store.kv_put("during", b"2")
        assert await store.kv_get("during") == b"2"  # committed locally
        state = await store.copy_state()
        assert state is not None
        assert state.pending_first_seq == 2
        storage.down = False
        for _ in range(1000):  # the copier retries with a growing backoff; "during" goes up then
            if copy.copied_seq >= 2:
                break
            await asyncio.sleep(0.01)
        assert copy.copied_seq == 2
        await store.kv_put("after", b"3")
        assert copy.copied_seq == 3
        assert copy.stats["retries"] >= 1
    finally:
        await copy.close()
    report = await restore(memory, namespace=NS, data_dir=tmp_path / "b")
    assert report.last_seq == 3
    assert sorted(dump(tmp_path / "b" / "metadata.db")["kv"]) == [
        ("after", b"3"),
        ("before", b"1"),
        ("during", b"2"),
    ]


async def test_a_restart_uploads_what_an_earlier_process_left_pending(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    path = tmp_path / "a" / "metadata.db"
    storage = MemoryObjectStorage()
    store = await SqliteMetadataStore.open(path)
    copy = MetadataCopy(store, storage, namespace=NS)
    await copy.start()
    await store.kv_put("a", b"1")
    await copy.close()
    await store.kv_put("b", b"2")  # no copy attached: logged, not uploaded
    await store.close()
    store = await SqliteMetadataStore.open(path)
    try:
        state = await store.copy_state()
        assert state is not None
        assert state.pending_first_seq == 2
        copy = MetadataCopy(store, storage, namespace=NS)
        await copy.start()
        for _ in range(100):
            if copy.copied_seq == 2:
                break
            await asyncio.sleep(0.02)
        assert copy.copied_seq == 2
        await copy.close()
    finally:
        await store.close()
    report = await restore(storage, namespace=NS, data_dir=tmp_path / "b")
    assert report.last_seq == 2
    assert sorted(dump(tmp_path / "b" / "metadata.db")["kv"]) == [("a", b"1"), ("b", b"2")]


async def test_restore_refuses_a_directory_that_holds_anything(
    store: SqliteMetadataStore, tmp_path: Path
) -> None:
    storage = MemoryObjectStorage()
    copy = MetadataCopy(store, storage, namespace=NS)
    await copy.start()
    await copy.close()
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "wal").write_bytes(b"x")
    with pytest.raises(ConflictError, match="never overwrites"):
        await restore(storage, namespace=NS, data_dir=tmp_path / "b")
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["wal"]
    with pytest.raises(ConflictError):
        await restore(storage, namespace=NS, data_dir=tmp_path / "a")
    (tmp_path / "c").mkdir()  # an empty directory is fine
    report = await restore(storage, namespace=NS, data_dir=tmp_path / "c")
    assert report.last_seq == 0


async def test_restore_picks_the_copy_written_last_and_names_the_others(tmp_path: Path) -> None:
    storage = MemoryObjectStorage()
    ids = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        s = await SqliteMetadataStore.open(tmp_path / name / "metadata.db")
        copy = MetadataCopy(s, storage, namespace=NS)
        await copy.start()
        await s.kv_put("owner", name.encode())
        await copy.close()
        await s.close()
        ids.append(copy.copy_id)
        await asyncio.sleep(1.1)  # last-modified times have one-second resolution on some stores
    report = await restore(storage, namespace=NS, data_dir=tmp_path / "r1")
    assert report.copy_id == ids[1]
    assert report.other_copies == (ids[0],)
    report = await restore(storage, namespace=NS, data_dir=tmp_path / "r2", copy_id=ids[0])
    assert dump(tmp_path / "r2" / "metadata.db")["kv"] == [("owner", b"a")]


async def test_a_snapshot_holds_whole_group_commits_only(store: SqliteMetadataStore, tmp_path: Path) -> None:
    storage = MemoryObjectStorage()
    copy = MetadataCopy(store, storage, namespace=NS, snapshot_every_groups=1)
    await copy.start()
    try:
        await asyncio.gather(*(store.kv_put(f"k{i}", b"v") for i in range(200)))
    finally:
        await copy.close()
    for key in [k for k in await keys(storage) if "/snapshot/" in k]:
        seq, database = decode_snapshot(await storage.get(key), source=key)
        (tmp_path / "s.db").write_bytes(bytes(database))
        conn = sqlite3.connect(tmp_path / "s.db")
        (next_seq,) = conn.execute("SELECT next_seq FROM copy_state").fetchone()
        conn.close()
        (tmp_path / "s.db").unlink()
        assert next_seq == seq + 1


async def test_operations_still_commit_when_the_copy_task_is_gone(store: SqliteMetadataStore) -> None:
    storage = MemoryObjectStorage()
    copy = MetadataCopy(store, storage, namespace=NS)
    await copy.start()
    await copy.close()
    assert await store.kv_put("x", b"1") == b"1"  # detached: logged for the next copy, not waited for
    state = await store.copy_state()
    assert state is not None
    assert state.pending_first_seq == state.next_seq - 1


class KilledAfterLogPut(FlakyStorage):
    """The in-memory storage where, once ``kill`` is set, a log object's PUT stores the object and then
    never returns: the process dies after the upload and before it deletes the log's pending rows."""

    def __init__(self, inner: MemoryObjectStorage) -> None:
        super().__init__(inner)
        self.kill = False
        self.stored: list[str] = []

    async def put(self, key: str, data: bytes | bytearray | memoryview, *, if_absent: bool = False) -> None:
        await self.inner.put(key, data, if_absent=if_absent)
        if self.kill and "/log/" in key:
            self.stored.append(key)
            await asyncio.Event().wait()


def data_tables(path: Path) -> dict[str, list[tuple[object, ...]]]:
    """:func:`dump` without node sessions and leases (not in the copy's log)."""
    return {n: rows for n, rows in dump(path).items() if n not in ("nodes", "leases")}


async def test_groups_uploaded_but_still_pending_at_a_kill_are_restored_once_and_uploaded_again_once(
    tmp_path: Path,
) -> None:
    (tmp_path / "a").mkdir()
    path = tmp_path / "a" / "metadata.db"
    memory = MemoryObjectStorage()
    storage = KilledAfterLogPut(memory)
    store = await SqliteMetadataStore.open(path)
    copy = MetadataCopy(store, storage, namespace=NS, wait_timeout_ms=2_000)
    await copy.start()
    await work(store, 3)
    sid = (await store.list_streams())[0].stream_id
    oid = await store.prepare_objects(count=1, ttl_ms=60_000)
    storage.kill = True
    with pytest.raises(UnavailableError):  # never acknowledged: its log's PUT never returned
        await store.commit_stream_set_object(
            CommitStreamSetObjectRequest(NODE, 5, oid, oid, 100, (StreamOffsetRange(sid, 10, 20, 100),))
        )
    await copy.close()
    state = await store.copy_state()
    await store.close()
    assert state is not None
    killed_seq = state.next_seq - 1
    assert storage.stored == [log_key(copy.prefix, killed_seq, killed_seq)]
    assert state.pending_first_seq == killed_seq  # in the bucket and still pending
    shutil.copy(path, tmp_path / "killed.db")

    # restore applies the group once; the killed database's pending groups after it were never copied
    report = await restore(memory, namespace=NS, data_dir=tmp_path / "b")
    assert (report.last_seq, report.stopped) == (killed_seq, None)
    restored = tmp_path / "b" / "metadata.db"
    assert (
        replay_uncopied(tmp_path / "killed.db", restored, tmp_path / "r.db", restored_last_seq=killed_seq)
        == []
    )
    assert data_tables(tmp_path / "r.db") == data_tables(tmp_path / "killed.db")

    # the next process uploads the pending group again, batched with a newer one: overlapping logs
    store = await SqliteMetadataStore.open(path)
    try:
        await store.kv_put("after-kill", b"1")  # no copy attached yet: pending
        copy = MetadataCopy(store, memory, namespace=NS)
        await copy.start()
        try:
            for _ in range(250):
                if copy.copied_seq == killed_seq + 1:
                    break
                await asyncio.sleep(0.02)
            assert copy.copied_seq == killed_seq + 1
            await store.kv_put("attached", b"2")
            await work(store, 2)
            assert copy.copied_seq > killed_seq + 1
        finally:
            await copy.close()
    finally:
        await store.close()
    found = await keys(memory)
    assert log_key(copy.prefix, killed_seq, killed_seq) in found
    assert log_key(copy.prefix, killed_seq, killed_seq + 1) in found
    report = await restore(memory, namespace=NS, data_dir=tmp_path / "c")
    assert report.stopped is None
    assert data_tables(tmp_path / "c" / "metadata.db") == data_tables(path)


async def test_a_failed_local_snapshot_is_retried_not_fatal(
    store: SqliteMetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = sqlite_copy.snapshot_into
    failures = [sqlite3.OperationalError("database or disk is full")]

    def failing_once(path: str, target: str, *, busy_timeout_ms: int) -> int:
        if failures:
            raise failures.pop()
        return real(path, target, busy_timeout_ms=busy_timeout_ms)

    monkeypatch.setattr(sqlite_copy, "snapshot_into", failing_once)
    storage = MemoryObjectStorage()
    copy = MetadataCopy(store, storage, namespace=NS)
    await copy.start()
    try:
        await first_snapshot(storage)
        await store.kv_put("a", b"1")  # the copy lives on: the write returns once copied
        assert copy.copied_seq == 1
        assert copy.stats["retries"] >= 1
    finally:
        await copy.close()
