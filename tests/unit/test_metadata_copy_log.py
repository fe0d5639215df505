"""The SQLite store's change log for the metadata copy: one pending_copy row per group commit, written in
the commit's own transaction, only once the copy is on; operations wait for the copy when asked to."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from s3stream.ids import NodeId
from s3stream.metadata.changelog import decode_group
from s3stream.metadata.changes import PutKv, PutNode
from s3stream.metadata.sqlite import SqliteMetadataStore
from s3stream.metadata.sqlite_copy import SNAPSHOT_NONE


def _rows(path: Path) -> list[tuple[int, bytes]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT seq, payload FROM pending_copy ORDER BY seq").fetchall()
    finally:
        conn.close()


async def test_nothing_is_logged_while_the_copy_is_off(tmp_path: Path) -> None:
    store = await SqliteMetadataStore.open(tmp_path / "m.db")
    try:
        await store.kv_put("a", b"1")
        assert await store.copy_state() is None
    finally:
        await store.close()
    assert _rows(tmp_path / "m.db") == []


async def test_each_operation_is_logged_with_its_changes_once_the_copy_is_on(tmp_path: Path) -> None:
    store = await SqliteMetadataStore.open(tmp_path / "m.db")
    try:
        state = await store.copy_enable()
        assert (state.next_seq, state.snapshot_seq, state.copied_seq) == (1, SNAPSHOT_NONE, -1)
        assert len(state.copy_id) == 16
        assert int(state.copy_id, 16) >= 0
        assert (await store.copy_enable()).copy_id == state.copy_id  # enabling again keeps it
        await store.kv_put("a", b"1")
        await store.register_node(node_id=NodeId(1), node_epoch=9)  # a session change: not logged
        await store.kv_put("a", b"1", overwrite=False)  # changes nothing: no group
        await store.create_stream(node_id=NodeId(1), node_epoch=9)
        after = await store.copy_state()
        assert after is not None
        assert (after.next_seq, after.pending_first_seq) == (3, 1)
        assert after.last_commit_ms > 0
    finally:
        await store.close()
    rows = _rows(tmp_path / "m.db")
    assert [seq for seq, _ in rows] == [1, 2]
    assert decode_group(rows[0][1], source="r").changes == [PutKv("a", b"1")]
    changes = decode_group(rows[1][1], source="r").changes
    assert changes
    assert not any(isinstance(c, PutNode) for c in changes)


async def test_a_group_commit_is_one_row_and_a_failed_operation_leaves_nothing_in_it(tmp_path: Path) -> None:
    store = await SqliteMetadataStore.open(tmp_path / "m.db")
    try:
        await store.copy_enable()
        await store.kv_put("taken", b"x")
        results = await asyncio.gather(
            *(store.kv_put(f"k{i}", b"v") for i in range(20)),
            store.open_stream(node_id=NodeId(1), node_epoch=1, stream_id=0, epoch=0),  # type: ignore[arg-type]
            return_exceptions=True,
        )
        assert all(r == b"v" for r in results[:20])
        assert isinstance(results[20], Exception)  # node not registered: rolled back alone
    finally:
        await store.close()
    rows = _rows(tmp_path / "m.db")
    changes = [c for _, payload in rows[1:] for c in decode_group(payload, source="r").changes]
    assert sorted(changes, key=lambda c: c.key) == sorted(  # type: ignore[union-attr]
        [PutKv(f"k{i}", b"v") for i in range(20)], key=lambda c: c.key
    )
    assert len(rows) < 21  # queued operations shared group commits


async def test_write_operations_wait_for_the_copy_of_what_they_saw(tmp_path: Path) -> None:
    store = await SqliteMetadataStore.open(tmp_path / "m.db")
    waited: list[int] = []
    release = asyncio.Event()

    async def wait(seq: int) -> None:
        waited.append(seq)
        await release.wait()

    try:
        await store.copy_enable()
        store.attach_copy(wait)
        task = asyncio.create_task(store.kv_put("a", b"1"))
        await asyncio.sleep(0.05)
        assert not task.done()
        assert waited == [1]
        release.set()
        assert await task == b"1"
        # an operation that changes nothing still waits for the groups it saw
        assert await store.kv_put("a", b"2", overwrite=False) == b"1"
        assert waited == [1, 1]
        assert await store.kv_get("a") == b"1"  # reads do not wait
        assert waited == [1, 1]
        store.attach_copy(None)
        await store.kv_put("b", b"1")
        assert waited == [1, 1]
    finally:
        await store.close()
