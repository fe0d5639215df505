"""The MetadataStore contract on SQLite, plus what only a file can show: durability, migrations,
damage, locking, group commit."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from s3stream.errors import (
    ConflictError,
    CorruptionError,
    FencedError,
    InvalidArgumentError,
    NotFoundError,
    UnavailableError,
)
from s3stream.ids import NodeId, StreamId
from s3stream.metadata import sql_view, sqlite_schema
from s3stream.metadata import sqlite as sqlite_module
from s3stream.metadata.base import NodeInfo, ObjectState, StreamState
from s3stream.metadata.memory import MemoryMetadataStore
from s3stream.metadata.sqlite import SqliteMetadataStore
from s3stream.metadata.sqlite_readonly import ReadOnlySqliteStore
from tests.support.metadata_contract import (
    EPOCH,
    N1,
    N2,
    TTL_MS,
    FakeClock,
    MetadataContract,
    node,
    opened,
    snapshot,
    sso_request,
    upload,
)


class TestSqliteMetadataStore(MetadataContract):
    @pytest.fixture
    async def store(self, clock: FakeClock, tmp_path: Path) -> AsyncIterator[SqliteMetadataStore]:
        store = await SqliteMetadataStore.open(tmp_path / "meta.db", clock_ms=clock)
        yield store
        await store.close()


async def _populated(path: Path, clock: FakeClock) -> SqliteMetadataStore:
    store = await SqliteMetadataStore.open(path, clock_ms=clock)
    await node(store)
    sid = await opened(store)
    await upload(store, N1, [(sid, 0, 10)], [(sid, 10, 20)])
    await store.prepare_objects(count=2, ttl_ms=TTL_MS)
    await store.kv_put("a", b"value")
    return store


async def test_state_survives_close_and_reopen(tmp_path: Path) -> None:
    clock = FakeClock()
    store = await _populated(tmp_path / "m.db", clock)
    before = await snapshot(store)
    await store.close()
    reopened = await SqliteMetadataStore.open(tmp_path / "m.db", clock_ms=clock)
    try:
        assert await snapshot(reopened) == before
        assert await reopened.create_stream(node_id=N1, node_epoch=EPOCH) == 1  # the id counter survived
        assert await reopened.prepare_objects(count=1, ttl_ms=TTL_MS) == 4
    finally:
        await reopened.close()


async def test_connection_settings(tmp_path: Path) -> None:
    store = await SqliteMetadataStore.open(tmp_path / "m.db")
    try:
        pragmas = await store._worker.call(
            lambda c: [
                c.execute(f"PRAGMA {p}").fetchone()[0]
                for p in ("journal_mode", "synchronous", "foreign_keys")
            ],
            write=False,
        )
        assert pragmas == ["wal", 2, 1]
        assert await store.schema_version() == sqlite_schema.LATEST_VERSION
    finally:
        await store.close()


async def test_an_old_version_database_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path, isolation_level=None)
    assert sqlite_schema.migrate(conn, target_version=1) == 0
    conn.execute("INSERT INTO nodes VALUES (1, 7)")
    conn.execute('INSERT INTO streams VALUES (0, 0, 1, 0, 10, \'{"topic":"t"}\')')
    conn.execute("INSERT INTO ranges VALUES (0, 0, 0, 0, 10, 1)")
    conn.execute("INSERT INTO counters VALUES ('next_stream_id', 1)")
    conn.close()
    store = await SqliteMetadataStore.open(path)
    try:
        assert await store.schema_version() == sqlite_schema.LATEST_VERSION
        stream = await store.describe_stream(StreamId(0))
        assert (stream.state, stream.end_offset, dict(stream.tags)) == (
            StreamState.OPENED,
            10,
            {"topic": "t"},
        )
        assert await store.kv_put("k", b"v") == b"v"  # the table version 2 added
        assert [s.stream_id for s in await store.register_node(node_id=NodeId(1), node_epoch=7)] == [0]
    finally:
        await store.close()


async def test_a_version_2_node_with_a_wall_clock_epoch_migrates_unleased_and_reopens_above_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "v2.db"
    wall_clock_epoch = 1_700_000_000_000
    conn = sqlite3.connect(path, isolation_level=None)
    assert sqlite_schema.migrate(conn, target_version=2) == 0
    conn.execute("INSERT INTO nodes VALUES (1, ?)", (wall_clock_epoch,))
    conn.close()
    clock = FakeClock()
    store = await SqliteMetadataStore.open(path, clock_ms=clock)
    try:
        assert await store.list_nodes() == [NodeInfo(NodeId(1), wall_clock_epoch, -1, -1, -1)]
        store.bind_node(NodeId(1), wall_clock_epoch)  # unleased: valid while its epoch is current
        clock.advance(10**9)
        await store.kv_put("k", b"v")
        info = await store.open_node(node_id=NodeId(1), lease_ms=1000)
        assert info.node_epoch == wall_clock_epoch + 1
        with pytest.raises(FencedError):
            await store.kv_put("k", b"w")
        assert await store.kv_get("k") == b"v"
    finally:
        await store.close()


async def test_a_newer_schema_refuses_to_open_and_stays_untouched(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    await (await SqliteMetadataStore.open(path)).close()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("UPDATE schema_version SET version = 99")
    conn.close()
    data = path.read_bytes()
    with pytest.raises(ConflictError, match="newer"):
        await SqliteMetadataStore.open(path)
    assert path.read_bytes() == data


async def test_a_file_that_is_not_a_database_is_corruption(tmp_path: Path) -> None:
    path = tmp_path / "junk.db"
    path.write_bytes(b"this is not sqlite" * 300)
    with pytest.raises(CorruptionError) as info:
        await SqliteMetadataStore.open(path)
    assert info.value.source == str(path)


async def test_a_damaged_page_is_corruption(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    store = await _populated(path, FakeClock())
    for i in range(200):
        await store.kv_put(f"key-{i}", bytes(200))
    await store.close()
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    raw = bytearray(path.read_bytes())
    page_size = int.from_bytes(raw[16:18], "big")
    assert len(raw) >= 4 * page_size
    for i in range(page_size + 8, 3 * page_size, 7):  # scribble over pages 2 and 3 (past their headers)
        raw[i] ^= 0x5A
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptionError):
        await SqliteMetadataStore.open(path)


async def test_a_foreign_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "foreign.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE something (x)")
    conn.close()
    with pytest.raises(InvalidArgumentError, match="not an s3stream"):
        await SqliteMetadataStore.open(path)


async def test_bad_stored_values_are_corruption(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    store = await _populated(path, FakeClock())
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("UPDATE objects SET state = 9 WHERE object_id = 0")
    conn.execute("UPDATE streams SET tags = '[1, 2]'")
    conn.close()
    try:
        with pytest.raises(CorruptionError, match="ObjectState"):
            await store.get_object(0)  # type: ignore[arg-type]
        with pytest.raises(CorruptionError, match="tags"):
            await store.list_streams()
        assert await store.kv_get("a") == b"value"  # the store stays usable
    finally:
        await store.close()


async def test_a_lock_held_too_long_is_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    store = await SqliteMetadataStore.open(path, busy_timeout_ms=100)
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(UnavailableError) as info:
            await store.kv_put("a", b"1")
        assert info.value.retriable
        assert await store.kv_get("a") is None  # reads still work beside a writer
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    try:
        assert await store.kv_put("a", b"1") == b"1"
    finally:
        await store.close()


_WRITE_HOLDER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
conn.execute("INSERT INTO kv (key, value) VALUES ('held', x'00')")
print("holding", flush=True)
sys.stdin.readline()
conn.execute("COMMIT")
"""


async def test_opening_a_current_database_beside_a_long_writer_does_not_wait_for_it(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    store = await SqliteMetadataStore.open(path)
    await store.close()
    holder = subprocess.Popen(
        [sys.executable, "-c", _WRITE_HOLDER, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdin is not None
        assert holder.stdout.readline() == "holding\n"
        # The other process holds the write lock far beyond this opener's busy timeout.
        opener = await SqliteMetadataStore.open(path, busy_timeout_ms=200)
        try:
            assert await opener.schema_version() == sqlite_schema.LATEST_VERSION
            assert await opener.kv_get("held") is None  # its snapshot predates the writer's commit
            with pytest.raises(UnavailableError):
                await opener.kv_put("a", b"1")  # a write still waits for the lock, and gives up
        finally:
            await opener.close()
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.wait(timeout=30) == 0
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


async def test_an_old_database_migrates_once_when_two_openers_race(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path, isolation_level=None)
    sqlite_schema.migrate(conn, target_version=1)
    conn.close()
    stores = await asyncio.gather(*(SqliteMetadataStore.open(path, busy_timeout_ms=5_000) for _ in range(4)))
    try:
        for store in stores:
            assert await store.schema_version() == sqlite_schema.LATEST_VERSION
    finally:
        for store in stores:
            await store.close()


async def test_a_lock_released_within_the_timeout_is_waited_for(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    store = await SqliteMetadataStore.open(path, busy_timeout_ms=5_000)
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    timer = threading.Timer(0.2, lambda: holder.execute("ROLLBACK"))
    timer.start()
    try:
        assert await store.kv_put("a", b"1") == b"1"
    finally:
        timer.join()
        holder.close()
        await store.close()


async def test_concurrent_operations_commit_or_fail_one_by_one(tmp_path: Path) -> None:
    store = await SqliteMetadataStore.open(tmp_path / "m.db")
    try:
        await node(store)
        results = await asyncio.gather(
            *[store.create_stream(node_id=N1, node_epoch=EPOCH) for _ in range(100)],
            *[
                store.open_stream(node_id=N1, node_epoch=EPOCH, stream_id=StreamId(500 + i), epoch=0)
                for i in range(20)
            ],
            *[store.kv_put(f"k{i}", b"v") for i in range(50)],
            return_exceptions=True,
        )
        assert sorted(r for r in results[:100] if isinstance(r, int)) == list(range(100))
        assert all(isinstance(r, NotFoundError) for r in results[100:120])
        assert results[120:] == [b"v"] * 50
        assert len(await store.list_streams()) == 100
    finally:
        await store.close()


async def test_open_needs_a_file_path(tmp_path: Path) -> None:
    for bad in (":memory:", "", "file:x?mode=memory", str(tmp_path / "missing" / "m.db")):
        with pytest.raises(InvalidArgumentError):
            await SqliteMetadataStore.open(bad)


async def test_two_stores_on_one_file_see_each_others_commits(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    a = await SqliteMetadataStore.open(path)
    b = await SqliteMetadataStore.open(path)
    try:
        await node(a)
        sid = await opened(a)
        await upload(a, N1, [(sid, 0, 10)])
        assert (await b.describe_stream(sid)).end_offset == 10
        objects = await b.list_objects([ObjectState.COMMITTED])
        assert len(objects) == 1
    finally:
        await a.close()
        await b.close()


async def test_a_bug_in_one_operation_fails_its_batch_only(tmp_path: Path) -> None:
    store = await SqliteMetadataStore.open(tmp_path / "m.db")
    try:

        def broken(conn: sqlite3.Connection) -> None:
            conn.execute("INSERT INTO kv (key, value) VALUES ('half', x'00')")
            raise ZeroDivisionError("a bug")

        with pytest.raises(ZeroDivisionError):
            await store._worker.call(broken, write=True)
        assert await store.kv_get("half") is None  # rolled back
        assert await store.kv_put("a", b"1") == b"1"  # the thread lives on
    finally:
        await store.close()


async def test_a_failing_migration_leaves_the_old_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path, isolation_level=None)
    sqlite_schema.migrate(conn, target_version=1)
    conn.close()
    broken = (*sqlite_schema.MIGRATIONS[1][:1], "CREATE TABLE kv (duplicate)")
    monkeypatch.setattr(sqlite_schema, "MIGRATIONS", (sqlite_schema.MIGRATIONS[0], broken))
    with pytest.raises(UnavailableError):
        await SqliteMetadataStore.open(path)
    conn = sqlite3.connect(path, isolation_level=None)
    assert sqlite_schema.schema_version(conn) == 1
    assert conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'kv'").fetchone() is None
    conn.close()
    monkeypatch.undo()
    store = await SqliteMetadataStore.open(path)
    try:
        assert await store.schema_version() == sqlite_schema.LATEST_VERSION
    finally:
        await store.close()


async def test_two_stores_writing_one_file_never_lose_an_update(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    a = await SqliteMetadataStore.open(path)
    b = await SqliteMetadataStore.open(path)
    try:
        await node(a)
        ids = await asyncio.gather(
            *[(a if i % 2 else b).create_stream(node_id=N1, node_epoch=EPOCH) for i in range(60)]
        )
        assert sorted(ids) == list(range(60))
        firsts = await asyncio.gather(
            *[(a if i % 2 else b).prepare_objects(count=3, ttl_ms=TTL_MS) for i in range(20)]
        )
        assert sorted(firsts) == list(range(0, 60, 3))
    finally:
        await a.close()
        await b.close()


class _CountingQueue:
    """The worker's job queue, counting the jobs handed to it."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.puts = 0

    def put(self, job: object) -> None:
        self.puts += 1
        self.inner.put(job)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_queued_operations_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Callers beyond QUEUED_OPERATIONS_MAX wait for a slot instead of growing the thread's queue."""
    monkeypatch.setattr(sqlite_module, "QUEUED_OPERATIONS_MAX", 8)
    store = await SqliteMetadataStore.open(tmp_path / "m.db")
    jobs = _CountingQueue(store._worker._jobs)
    monkeypatch.setattr(store._worker, "_jobs", jobs)
    release = threading.Event()
    try:
        blocker = asyncio.ensure_future(store._worker.call(lambda c: release.wait(10), write=False))
        puts = [asyncio.ensure_future(store.kv_put(f"k{i}", b"v")) for i in range(40)]
        await asyncio.sleep(0.2)  # the thread is stuck in the blocker's batch
        assert jobs.puts == 8  # the blocker and 7 puts; 33 callers wait for a slot
        release.set()
        await blocker
        assert await asyncio.gather(*puts) == [b"v"] * 40
        assert jobs.puts == 41
    finally:
        release.set()
        await store.close()


async def test_a_commit_looks_its_streams_up_in_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One upload of many streams reads them with ``IN (...)`` lookups of at most _IDS_PER_QUERY ids;
    every range is still checked and every stream advanced (a deleted one is skipped)."""
    monkeypatch.setattr(sql_view, "_IDS_PER_QUERY", 2)
    store = await SqliteMetadataStore.open(tmp_path / "meta.db", clock_ms=FakeClock())
    try:
        await node(store)
        sids = [await opened(store) for _ in range(5)]
        await upload(store, N1, [(sid, 0, 10) for sid in sids[:4]], [(sids[4], 0, 7)])
        await store.close_stream(node_id=N1, node_epoch=EPOCH, stream_id=sids[0], epoch=0)
        await store.delete_stream(stream_id=sids[0], epoch=0)
        await upload(store, N1, [(sid, 10, 20) for sid in sids[:4]])
        ends = [(await store.describe_stream(sid)).end_offset for sid in sids[1:]]
        assert ends == [20, 20, 20, 7]
        with pytest.raises(ConflictError):
            await upload(store, N1, [(sids[1], 20, 30), (sids[2], 25, 30)])  # sids[2] does not continue
        assert [(await store.describe_stream(sid)).end_offset for sid in sids[1:3]] == [20, 20]
    finally:
        await store.close()


@pytest.mark.parametrize(
    ("column", "value", "match"),
    [("state", 9, "StreamState"), ("end_offset", "'x'", "integer"), ("start_offset", "1.5", "integer")],
)
async def test_a_commit_finds_bad_stored_stream_values_corrupt(
    tmp_path: Path, column: str, value: object, match: str
) -> None:
    """The end-offset advance of an upload reads each stream's state, offsets and last range as
    plain values: what is stored is still checked, and the failed commit writes nothing."""
    path = tmp_path / "meta.db"
    store = await SqliteMetadataStore.open(path, clock_ms=FakeClock())
    try:
        await node(store)
        stream_id = await opened(store)
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute(f"UPDATE streams SET {column} = {value} WHERE stream_id = ?", (stream_id,))
        conn.close()
        first = await store.prepare_objects(count=1, ttl_ms=60_000)
        with pytest.raises(CorruptionError, match=match):
            await store.commit_stream_set_object(sso_request(N1, first, [(stream_id, 0, 10)]))
        assert (await store.get_object(first)).state == ObjectState.PREPARED
    finally:
        await store.close()


async def test_a_common_upload_is_checked_in_sql_with_no_lookup_per_stream(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every span continuing its opened, owned stream at its end: one SQL check per
    _SPANS_PER_QUERY spans and the advance, no stream head read into Python; anything else (a
    stream's first upload from offset 0, a gap) still takes the check span by span."""
    monkeypatch.setattr(sql_view, "_SPANS_PER_QUERY", 2)
    store = await SqliteMetadataStore.open(tmp_path / "meta.db", clock_ms=FakeClock())
    try:
        await node(store)
        sids = [await opened(store) for _ in range(5)]
        await upload(store, N1, [(sid, 0, 10) for sid in sids[:4]], [(sids[4], 0, 7)])

        def no_heads(self: object, stream_ids: object) -> None:
            raise AssertionError("the common case reads no stream heads")

        with monkeypatch.context() as patch:
            patch.setattr(sql_view.SqlView, "stream_heads", no_heads)
            await upload(store, N1, [(sid, 10, 20) for sid in sids[:4]], [(sids[4], 7, 9)])
        streams = [await store.describe_stream(sid) for sid in sids]
        assert [s.end_offset for s in streams] == [20, 20, 20, 20, 9]
        assert [[(r.range_index, r.end_offset) for r in s.ranges] for s in streams] == [[(0, 20)]] * 4 + [
            [(0, 9)]
        ]
        with pytest.raises(ConflictError):
            await upload(store, N1, [(sids[1], 20, 30), (sids[2], 25, 30)])  # sids[2] does not continue
        assert [(await store.describe_stream(sid)).end_offset for sid in sids[1:3]] == [20, 20]
    finally:
        await store.close()


async def test_the_sql_continuity_check_agrees_with_the_memory_twin(tmp_path: Path) -> None:
    """``all_continue_at_end`` of the SQLite view answers as the in-memory twin's, case by case."""
    stores: list[Any] = [
        await SqliteMetadataStore.open(tmp_path / "meta.db", clock_ms=FakeClock()),
        MemoryMetadataStore(clock_ms=FakeClock()),
    ]
    answers = []
    try:
        for store in stores:
            await node(store, N1, N2)
            live, fresh, closed, trimmed, moved = [await opened(store) for _ in range(5)]
            await upload(store, N1, [(s, 0, 10) for s in (live, closed, trimmed, moved)])
            await store.close_stream(node_id=N1, node_epoch=EPOCH, stream_id=closed, epoch=0)
            await store.trim_stream(
                node_id=N1, node_epoch=EPOCH, stream_id=trimmed, epoch=0, new_start_offset=10
            )
            await store.close_stream(node_id=N1, node_epoch=EPOCH, stream_id=moved, epoch=0)
            await store.open_stream(node_id=N2, node_epoch=EPOCH, stream_id=moved, epoch=1)
            cases = [
                (N1, [(live, 10, 20)]),  # the common case
                (N1, [(live, 10, 20), (moved, 10, 20)]),  # moved's last range is N2's
                (N2, [(moved, 10, 20)]),
                (N1, [(live, 11, 20)]),  # gap
                (N1, [(live, 5, 20)]),  # overlap
                (N1, [(fresh, 0, 10)]),  # nothing stored yet: start = end
                (N1, [(closed, 10, 20)]),
                (N1, [(trimmed, 10, 20)]),  # trimmed to its end
                (N1, [(StreamId(999), 0, 10)]),  # no such stream
            ]
            answers.append(
                [await store._query(lambda view, n=n, s=s: view.all_continue_at_end(n, s)) for n, s in cases]
            )
    finally:
        for store in stores:
            await store.close()
    assert answers[0] == answers[1] == [True, False, True, False, False, False, False, False, False]


async def test_a_new_epoch_issued_through_another_connection_fences_a_bound_store(tmp_path: Path) -> None:
    clock = FakeClock()
    first = await SqliteMetadataStore.open(tmp_path / "m.db", clock_ms=clock)
    second = await SqliteMetadataStore.open(tmp_path / "m.db", clock_ms=clock)
    try:
        old = await first.open_node(node_id=N1, lease_ms=60_000)
        first.bind_node(N1, old.node_epoch)
        await first.kv_put("k", b"old")
        new = await second.open_node(node_id=N1, lease_ms=60_000)  # the node restarted elsewhere
        assert new.node_epoch == old.node_epoch + 1
        with pytest.raises(FencedError):
            await first.kv_put("k", b"stale")
        second.bind_node(N1, new.node_epoch)
        await second.kv_put("k", b"new")
        assert await first.kv_get("k") == b"new"
    finally:
        await first.close()
        await second.close()


async def test_nodes_of_a_version_2_file_read_without_migrating_are_unleased(tmp_path: Path) -> None:
    path = tmp_path / "v2.db"
    conn = sqlite3.connect(path, isolation_level=None)
    sqlite_schema.migrate(conn, target_version=2)
    conn.execute("INSERT INTO nodes VALUES (2, 5), (1, 9)")
    assert sql_view.SqlView(conn).nodes() == [
        NodeInfo(NodeId(1), 9, -1, -1, -1),
        NodeInfo(NodeId(2), 5, -1, -1, -1),
    ]
    assert sqlite_schema.schema_version(conn) == 2
    conn.close()


async def test_a_read_only_opener_reads_the_object_id_counter_a_writer_advances(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    writer = await SqliteMetadataStore.open(path)
    reader: ReadOnlySqliteStore | None = None
    try:
        await writer.prepare_objects(count=3, ttl_ms=TTL_MS)
        reader = await ReadOnlySqliteStore.open(path)
        assert await reader.next_object_id() == 3
        await writer.prepare_objects(count=2, ttl_ms=TTL_MS)
        assert await reader.next_object_id() == 5
    finally:
        if reader is not None:
            await reader.close()
        await writer.close()
