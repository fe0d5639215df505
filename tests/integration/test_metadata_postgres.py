"""The MetadataStore contract on PostgreSQL, plus what only a shared server can show: migrations,
schema damage, errors of an unreachable server, the server's clock."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
import urllib.parse
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from s3stream.errors import (
    ClosedError,
    ConflictError,
    CorruptionError,
    FencedError,
    InvalidArgumentError,
    UnavailableError,
)
from s3stream.ids import NodeId, ObjectId, StreamId
from s3stream.metadata import postgres_clock, postgres_schema, sqlite_schema
from s3stream.metadata.base import MetadataStore, StreamState
from s3stream.metadata.memory import MemoryMetadataStore
from s3stream.metadata.postgres import PostgresMetadataStore
from s3stream.metadata.url import open_metadata_store
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
from tests.support.postgres import with_search_path

ROOT = Path(__file__).resolve().parents[2]
SECRET = "n0t-the-real-pw-7d1f"


class TestPostgresMetadataStore(MetadataContract):
    @pytest.fixture
    async def store(self, clock: FakeClock, pg_url: str) -> AsyncIterator[PostgresMetadataStore]:
        store = await PostgresMetadataStore.open(pg_url, clock_ms=clock)
        yield store
        await store.close()


def _sql(url: str, *statements: str) -> list[Any]:
    """Run statements on the test's schema in autocommit mode; the rows of the last."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows: list[Any] = []
        for statement in statements:
            cursor = conn.execute(statement)
            rows = cursor.fetchall() if cursor.description else []
        return rows


async def _populated(url: str, clock: FakeClock) -> PostgresMetadataStore:
    store = await PostgresMetadataStore.open(url, clock_ms=clock)
    await node(store)
    sid = await opened(store)
    await upload(store, N1, [(sid, 0, 10)], [(sid, 10, 20)])
    await store.prepare_objects(count=2, ttl_ms=TTL_MS)
    await store.kv_put("a", b"value")
    await store.kv_put("b", b"\x00binary\xff")
    return store


# -- migrations -------------------------------------------------------------------------------------


async def test_a_fresh_schema_gets_sqlites_tables_at_the_latest_version(pg_url: str) -> None:
    store = await PostgresMetadataStore.open(pg_url)
    try:
        assert await store.schema_version() == postgres_schema.LATEST_VERSION == sqlite_schema.LATEST_VERSION
    finally:
        await store.close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        assert postgres_schema.schema_columns(conn) == postgres_schema.expected_columns()
    types = dict(
        ((t, c), d)
        for t, c, d in _sql(
            pg_url,
            "SELECT table_name, column_name, data_type FROM information_schema.columns "
            "WHERE table_schema = current_schema()",
        )
    )
    assert types[("streams", "end_offset")] == "bigint"
    assert types[("kv", "key")] == types[("kv", "value")] == "bytea"
    assert types[("streams", "tags")] == "text"


async def test_state_survives_close_and_reopen(pg_url: str) -> None:
    clock = FakeClock()
    store = await _populated(pg_url, clock)
    before = await snapshot(store)
    await store.close()
    reopened = await PostgresMetadataStore.open(pg_url, clock_ms=clock)
    try:
        assert await snapshot(reopened) == before
        assert await reopened.kv_get("b") == b"\x00binary\xff"
        assert await reopened.create_stream(node_id=N1, node_epoch=EPOCH) == 1  # the id counter survived
        assert await reopened.prepare_objects(count=1, ttl_ms=TTL_MS) == 4
    finally:
        await reopened.close()


async def test_an_old_version_schema_is_migrated(pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        assert postgres_schema.migrate(conn, target_version=1) == 0
    _sql(
        pg_url,
        "INSERT INTO nodes VALUES (1, 7)",
        'INSERT INTO streams VALUES (0, 0, 1, 0, 10, \'{"topic":"t"}\')',
        "INSERT INTO ranges VALUES (0, 0, 0, 0, 10, 1)",
        "INSERT INTO counters VALUES ('next_stream_id', 1)",
    )
    store = await PostgresMetadataStore.open(pg_url)
    try:
        assert await store.schema_version() == postgres_schema.LATEST_VERSION
        stream = await store.describe_stream(StreamId(0))
        assert (stream.state, stream.end_offset, dict(stream.tags)) == (
            StreamState.OPENED,
            10,
            {"topic": "t"},
        )
        assert await store.kv_put("k", b"v") == b"v"  # a table a later version added
        assert [s.stream_id for s in await store.register_node(node_id=NodeId(1), node_epoch=7)] == [0]
    finally:
        await store.close()


async def test_a_newer_schema_refuses_to_open_and_stays_untouched(pg_url: str) -> None:
    await (await PostgresMetadataStore.open(pg_url)).close()
    _sql(pg_url, "UPDATE schema_version SET version = 99")
    tables_before = _sql(pg_url, "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
    with pytest.raises(ConflictError, match="newer"):
        await PostgresMetadataStore.open(pg_url)
    assert _sql(pg_url, "SELECT version FROM schema_version") == [(99,)]
    assert (
        _sql(pg_url, "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()") == tables_before
    )


async def test_processes_opening_a_fresh_schema_at_once_create_it_once(pg_url: str) -> None:
    script = (
        "import asyncio, sys, time\n"
        "from s3stream.metadata.postgres import PostgresMetadataStore\n"
        "async def main():\n"
        "    time.sleep(max(0.0, float(sys.argv[2]) - time.time()))\n"
        "    store = await PostgresMetadataStore.open(sys.argv[1])\n"
        "    print(await store.schema_version())\n"
        "    await store.close()\n"
        "asyncio.run(main())\n"
    )
    start_at = time.time() + 2.0
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, pg_url, str(start_at)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(6)
    ]
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-2000:]
        assert out.strip() == str(postgres_schema.LATEST_VERSION)
    assert _sql(pg_url, "SELECT version FROM schema_version") == [(postgres_schema.LATEST_VERSION,)]


async def test_a_foreign_schema_is_refused(pg_url: str) -> None:
    _sql(pg_url, "CREATE TABLE something (x int)")
    with pytest.raises(InvalidArgumentError, match="not an s3stream"):
        await PostgresMetadataStore.open(pg_url)


async def test_a_damaged_schema_is_corruption(pg_url: str) -> None:
    await (await PostgresMetadataStore.open(pg_url)).close()
    _sql(pg_url, "ALTER TABLE streams DROP COLUMN tags")
    with pytest.raises(CorruptionError, match="streams"):
        await PostgresMetadataStore.open(pg_url)


async def test_a_search_path_naming_no_schema_is_invalid(pg_url: str) -> None:
    url = with_search_path(pg_url.partition("?")[0], "no_such_schema_here")
    with pytest.raises(InvalidArgumentError, match="search_path"):
        await PostgresMetadataStore.open(url)


# -- errors -----------------------------------------------------------------------------------------


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_a_server_that_is_not_there_is_unavailable_quickly_without_the_password() -> None:
    url = f"postgresql://someone:{SECRET}@127.0.0.1:{_closed_port()}/db"
    started = time.monotonic()
    with pytest.raises(UnavailableError) as info:
        await PostgresMetadataStore.open(url)
    assert time.monotonic() - started < 5
    assert info.value.retriable
    assert SECRET not in str(info.value)
    assert "someone:***@127.0.0.1" in str(info.value)


async def test_a_wrong_password_is_invalid_and_not_repeated(pg_url: str) -> None:
    parts = urllib.parse.urlsplit(pg_url)
    url = urllib.parse.urlunsplit(
        parts._replace(netloc=f"{parts.username}:{SECRET}@{parts.hostname}:{parts.port}")
    )
    with pytest.raises(InvalidArgumentError, match="refused the credentials") as info:
        await PostgresMetadataStore.open(url)
    assert SECRET not in str(info.value)


async def test_a_database_that_does_not_exist_is_invalid(pg_url: str) -> None:
    url = urllib.parse.urlunsplit(urllib.parse.urlsplit(pg_url)._replace(path="/no_such_database_here"))
    with pytest.raises(InvalidArgumentError, match="does not exist"):
        await PostgresMetadataStore.open(url)


@pytest.mark.parametrize("operation", ["read", "write"])
async def test_an_idle_connection_the_server_dropped_is_replaced_before_the_next_call(
    pg_url: str, operation: str
) -> None:
    """Nothing of the call reached the server, so it runs on a new connection instead of failing."""
    name = f"s3stream-drop-{uuid.uuid4().hex[:12]}"  # only this store's session is terminated
    sep = "&" if urllib.parse.urlsplit(pg_url).query else "?"
    store = await PostgresMetadataStore.open(f"{pg_url}{sep}application_name={name}", connections=1)
    try:
        await store.kv_put("a", b"1")
        for _ in range(2):
            _sql(
                pg_url,
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                f"WHERE application_name = '{name}' AND pid <> pg_backend_pid()",
            )
            await asyncio.sleep(0.05)  # the session has ended
            if operation == "read":
                assert await store.kv_get("a") == b"1"
            else:
                await store.kv_put("a", b"2")
                assert await store.kv_get("a") == b"2"
    finally:
        await store.close()


async def test_a_closed_store_is_closed_for_every_call(pg_url: str) -> None:
    store = await PostgresMetadataStore.open(pg_url)
    await store.close()
    with pytest.raises(ClosedError):
        await store.schema_version()
    with pytest.raises(ClosedError):
        await store.prepare_objects(count=1, ttl_ms=TTL_MS)


# -- transactions -----------------------------------------------------------------------------------


async def test_operations_racing_on_many_connections_serialize(pg_url: str) -> None:
    stores = [await PostgresMetadataStore.open(pg_url, connections=4) for _ in range(2)]
    try:
        await node(stores[0])
        created, prepared, kept = await asyncio.gather(
            asyncio.gather(*[stores[i % 2].create_stream(node_id=N1, node_epoch=EPOCH) for i in range(60)]),
            asyncio.gather(*[stores[i % 2].prepare_objects(count=3, ttl_ms=TTL_MS) for i in range(40)]),
            asyncio.gather(
                *[stores[i % 2].kv_put("contested", f"v{i}".encode(), overwrite=False) for i in range(20)]
            ),
        )
        assert sorted(created) == list(range(60))
        assert sorted(prepared) == list(range(0, 120, 3))  # every id handed out once
        winners = set(kept)
        assert len(winners) == 1
        assert winners == {await stores[0].kv_get("contested")}
    finally:
        for store in stores:
            await store.close()


async def test_a_refusal_rests_on_a_committed_state(pg_url: str) -> None:
    """Two nodes open one stream with one epoch at once: exactly one wins, the other is fenced."""
    stores = [await PostgresMetadataStore.open(pg_url) for _ in range(2)]
    try:
        await node(stores[0], N1, N2)
        for round_ in range(10):
            sid = await stores[0].create_stream(node_id=N1, node_epoch=EPOCH)
            results = await asyncio.gather(
                stores[0].open_stream(node_id=N1, node_epoch=EPOCH, stream_id=sid, epoch=round_),
                stores[1].open_stream(node_id=N2, node_epoch=EPOCH, stream_id=sid, epoch=round_),
                return_exceptions=True,
            )
            won = [r for r in results if not isinstance(r, BaseException)]
            assert len(won) == 1, results
            assert all(isinstance(r, FencedError) for r in results if isinstance(r, BaseException)), results
            stored = await stores[0].describe_stream(sid)
            assert [r.node_id for r in stored.ranges] == [won[0].ranges[-1].node_id]
    finally:
        for store in stores:
            await store.close()


# -- clock ------------------------------------------------------------------------------------------


async def test_the_default_clock_is_the_servers(pg_url: str) -> None:
    store = await PostgresMetadataStore.open(pg_url)
    try:
        for _ in range(3):
            (server_before,) = _sql(pg_url, postgres_clock.SERVER_NOW_MS)[0]
            first = await store.prepare_objects(count=1, ttl_ms=TTL_MS)
            (server_after,) = _sql(pg_url, postgres_clock.SERVER_NOW_MS)[0]
            prepared_at = (await store.get_object(ObjectId(first))).prepared_at_ms
            assert server_before - 50 <= prepared_at <= server_after + 50
            await asyncio.sleep(0.05)
    finally:
        await store.close()


def test_the_server_clock_never_goes_back(pg_url: str) -> None:
    clock = postgres_clock.ServerClock()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        clock.sample(conn)
        readings = [clock()]
        for _ in range(20):
            clock.sample(conn)
            readings.append(clock())
    assert readings == sorted(readings)
    assert not clock.stale()


# -- large commits (PostgreSQL's array statements) agree with the in-memory twin -------------------


async def _large_commits(store: MetadataStore) -> list[Any]:
    """Commits of 1,000 streams: the common case, then refusals in the middle of the batch."""
    outcomes: list[Any] = []
    await node(store, N1, N2)
    sids = [await store.create_stream(node_id=N1, node_epoch=EPOCH) for _ in range(1000)]
    for sid in sids[:-1]:
        await store.open_stream(node_id=N1, node_epoch=EPOCH, stream_id=sid, epoch=0)
    await store.open_stream(node_id=N2, node_epoch=EPOCH, stream_id=sids[-1], epoch=0)
    ends = dict.fromkeys(sids[:-1], 0)

    async def commit(spans: dict[StreamId, tuple[int, int]]) -> None:
        first = await store.prepare_objects(count=1, ttl_ms=TTL_MS)
        ranges = [(s, a, b) for s, (a, b) in sorted(spans.items())]
        try:
            await store.commit_stream_set_object(sso_request(N1, first, ranges))
            outcomes.append("accepted")
        except (ConflictError, FencedError) as exc:
            outcomes.append(exc.code.name)

    for _ in range(3):
        await commit({s: (e, e + 7) for s, e in ends.items()})
        ends = {s: e + 7 for s, e in ends.items()}
    await commit(
        {**{s: (e, e + 1) for s, e in ends.items()}, sids[500]: (ends[sids[500]] + 1, ends[sids[500]] + 2)}
    )
    await commit({**{s: (e, e + 1) for s, e in ends.items()}, sids[-1]: (0, 1)})
    await store.close_stream(node_id=N1, node_epoch=EPOCH, stream_id=sids[10], epoch=0)
    await commit({s: (e, e + 1) for s, e in ends.items()})
    outcomes.append(await snapshot(store))
    return outcomes


async def test_a_commit_of_a_thousand_streams_matches_the_twin(pg_url: str) -> None:
    store = await PostgresMetadataStore.open(pg_url, clock_ms=FakeClock())
    twin = MemoryMetadataStore(clock_ms=FakeClock())
    try:
        on_pg, on_twin = await _large_commits(store), await _large_commits(twin)
    finally:
        await store.close()
        await twin.close()
    assert on_pg[:6] == ["accepted"] * 3 + ["OFFSET_NOT_MATCHED", "STREAM_FENCED", "STREAM_NOT_OPENED"]
    assert on_pg == on_twin


async def test_the_metadata_url_opens_the_postgres_store_on_the_servers_clock(pg_url: str) -> None:
    store = await open_metadata_store(pg_url)
    try:
        assert isinstance(store, PostgresMetadataStore)
        assert isinstance(store._clock_ms, postgres_clock.ServerClock)
        assert await store.kv_put("k", b"v") == b"v"
    finally:
        await store.close()
    fake = FakeClock()
    store = await open_metadata_store(pg_url, clock_ms=fake)
    try:
        first = await store.prepare_objects(count=1, ttl_ms=TTL_MS)
        assert (await store.get_object(ObjectId(first))).prepared_at_ms == fake.now_ms
    finally:
        await store.close()


async def test_a_url_libpq_refuses_is_invalid_without_the_password() -> None:
    for url in (
        "postgresql://u:pw@127.0.0.1/db?no_such_option=1",
        f"postgresql://u:{SECRET}%zz@127.0.0.1/db",
    ):
        with pytest.raises(InvalidArgumentError, match="not a valid libpq URL") as info:
            await PostgresMetadataStore.open(url)
        assert SECRET not in str(info.value)
