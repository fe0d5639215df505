"""The cluster part of the MetadataStore contract on PostgreSQL, and its races: stores with their
own connections (as separate processes have) issuing the cluster operations at once, where only the
server's SERIALIZABLE transactions keep the rules."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import psycopg
import pytest

from s3stream.errors import ConflictError, ErrorCode, FencedError, NotOwnerError, S3StreamError
from s3stream.ids import NodeId, StreamId
from s3stream.metadata import postgres_schema
from s3stream.metadata.base import StreamState, TakeoverState
from s3stream.metadata.postgres import PostgresMetadataStore
from s3stream.metadata.url import open_metadata_store
from tests.support.cluster_contract import LEASE_MS, ClusterContract, commit, new_stream, session
from tests.support.metadata_contract import FakeClock

ROUNDS = 6


class TestPostgresClusterMetadata(ClusterContract):
    @pytest.fixture
    async def store(self, clock: FakeClock, pg_url: str) -> AsyncIterator[PostgresMetadataStore]:
        store = await PostgresMetadataStore.open(pg_url, clock_ms=clock)
        yield store
        await store.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def stores(pg_url: str, clock: FakeClock) -> AsyncIterator[list[PostgresMetadataStore]]:
    """Three stores on one schema, each with its own connections."""
    opened = [await PostgresMetadataStore.open(pg_url, clock_ms=clock) for _ in range(3)]
    yield opened
    for store in opened:
        await store.close()


async def test_two_controllers_starting_takeovers_at_once_one_wins(
    stores: list[PostgresMetadataStore], clock: FakeClock
) -> None:
    setup, c1, c2 = stores
    for round_index in range(ROUNDS):
        base = 10 * (round_index + 1)
        dead = [await session(setup, NodeId(base + i)) for i in range(2)]
        for info in dead:
            await new_stream(setup, info)
        clock.advance(LEASE_MS)
        taker = await session(setup, NodeId(base + 5))
        same_node = round_index % 2 == 0  # both name one dead node, or each its own
        targets = [dead[0], dead[0]] if same_node else dead
        results = await asyncio.gather(
            *(
                c.start_takeover(
                    node_id=t.node_id,
                    node_epoch=t.node_epoch,
                    taker_node_id=taker.node_id,
                    taker_node_epoch=taker.node_epoch,
                )
                for c, t in zip((c1, c2), targets, strict=True)
            ),
            return_exceptions=True,
        )
        won = [r for r in results if not isinstance(r, BaseException)]
        lost = [r for r in results if isinstance(r, BaseException)]
        assert len(won) == 1, results
        assert len(lost) == 1
        assert isinstance(lost[0], ConflictError), lost
        in_flight = [t for t in await setup.list_takeovers() if t.state != TakeoverState.DONE]
        assert in_flight == won
        winner = won[0]
        await setup.takeover_streams(
            node_id=winner.node_id, taker_node_id=taker.node_id, taker_node_epoch=taker.node_epoch
        )
        await setup.finish_takeover(
            node_id=winner.node_id,
            taker_node_id=taker.node_id,
            taker_node_epoch=taker.node_epoch,
            wal_end_offset=0,
        )


async def test_request_reassign_racing_open_stream_is_one_order_or_the_other(
    stores: list[PostgresMetadataStore], clock: FakeClock
) -> None:
    setup, opener, requester = stores
    a, b = await session(setup, NodeId(1)), await session(setup, NodeId(2))
    outcomes = {"open_first": 0, "request_first": 0}
    for _ in range(4 * ROUNDS):
        stream_id = await setup.create_stream(node_id=a.node_id, node_epoch=a.node_epoch)
        opened, requested = await asyncio.gather(
            opener.open_stream(node_id=a.node_id, node_epoch=a.node_epoch, stream_id=stream_id, epoch=0),
            requester.request_reassign(stream_ids=[stream_id], to_node_id=b.node_id),
            return_exceptions=True,
        )
        assert not isinstance(requested, BaseException), requested
        (row,) = requested
        stream = await setup.describe_stream(stream_id)
        if isinstance(opened, BaseException):
            # the request committed first: the open was refused, naming the target
            assert isinstance(opened, NotOwnerError), opened
            assert opened.owner_node_id == b.node_id
            assert row.from_node_id == -1
            assert stream.state == StreamState.CLOSED
            outcomes["request_first"] += 1
        else:
            # the open committed first: the request saw the stream open on A
            assert row.from_node_id == a.node_id, (row, opened)
            assert stream.ranges[-1].node_id == a.node_id
            outcomes["open_first"] += 1
        assert await setup.list_assignments() == [row]
        if stream.state == StreamState.OPENED:
            await setup.close_stream(node_id=a.node_id, node_epoch=a.node_epoch, stream_id=stream_id, epoch=0)
        await setup.delete_stream(stream_id=stream_id, epoch=-1)  # drops its row too
        assert await setup.list_assignments() == []
    print(outcomes)
    assert outcomes["open_first"] + outcomes["request_first"] == 4 * ROUNDS


async def test_a_second_taker_fences_the_first_takers_commits(
    stores: list[PostgresMetadataStore], clock: FakeClock
) -> None:
    setup, first_store, second_store = stores
    dead = await session(setup, NodeId(1))
    streams = [await new_stream(setup, dead) for _ in range(3)]
    clock.advance(LEASE_MS)
    t1, t2 = await session(setup, NodeId(2)), await session(setup, NodeId(3))
    await setup.start_takeover(
        node_id=dead.node_id,
        node_epoch=dead.node_epoch,
        taker_node_id=t1.node_id,
        taker_node_epoch=t1.node_epoch,
    )
    first_store.bind_node(t1.node_id, t1.node_epoch)
    second_store.bind_node(t2.node_id, t2.node_epoch)
    taken = await first_store.takeover_streams(
        node_id=dead.node_id, taker_node_id=t1.node_id, taker_node_epoch=t1.node_epoch
    )
    assert [s.stream_id for s, _ in taken] == streams
    accepted: dict[StreamId, int] = dict.fromkeys(streams, 0)
    refused: list[S3StreamError] = []
    handed_over = asyncio.Event()

    async def first_taker_uploads() -> None:
        """The first taker commits on and on; once the second one took over, every commit fails."""
        after_handover = 0
        while after_handover < 5:
            late = handed_over.is_set()
            stream_id = (
                streams[len(refused) % len(streams)] if refused else streams[sum(accepted.values()) % 3]
            )
            end = accepted[stream_id]
            try:
                await commit(first_store, t1, stream_id, end, end + 10)
            except (FencedError, ConflictError) as exc:
                refused.append(exc)
            else:
                assert not late, "a commit started after the second taker took the stream was accepted"
                accepted[stream_id] = end + 10
            after_handover += late

    async def controller_hands_over() -> None:
        while not sum(accepted.values()):  # a commit got through first, however slow the server is
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.02)
        await setup.reassign_takeover(
            node_id=dead.node_id, taker_node_id=t2.node_id, taker_node_epoch=t2.node_epoch
        )
        await second_store.takeover_streams(
            node_id=dead.node_id, taker_node_id=t2.node_id, taker_node_epoch=t2.node_epoch
        )
        handed_over.set()

    await asyncio.gather(first_taker_uploads(), controller_hands_over())
    assert refused, "the first taker was never fenced"
    for stream_id in streams:
        stream = await setup.describe_stream(stream_id)
        last = stream.ranges[-1]
        assert (last.node_id, stream.epoch) == (t2.node_id, 2)
        assert last.start_offset == stream.end_offset == accepted[stream_id], (
            "the second taker starts at the end"
        )
    with pytest.raises(ConflictError):
        await first_store.finish_takeover(
            node_id=dead.node_id, taker_node_id=t1.node_id, taker_node_epoch=t1.node_epoch, wal_end_offset=0
        )
    done = await second_store.finish_takeover(
        node_id=dead.node_id, taker_node_id=t2.node_id, taker_node_epoch=t2.node_epoch, wal_end_offset=7
    )
    assert (done.state, done.attempt) == (TakeoverState.DONE, 2)


async def test_the_read_only_url_serves_the_cluster_listings(pg_url: str, clock: FakeClock) -> None:
    store = await PostgresMetadataStore.open(pg_url, clock_ms=clock)
    try:
        a = await session(store, NodeId(1), "/w1")
        await session(store, NodeId(2))
        stream_id = await new_stream(store, a)
        await store.request_reassign(stream_ids=[stream_id], to_node_id=NodeId(2))
        clock.advance(LEASE_MS)
        b = await session(store, NodeId(2))
        await store.start_takeover(
            node_id=NodeId(1), node_epoch=a.node_epoch, taker_node_id=b.node_id, taker_node_epoch=b.node_epoch
        )
        reader = await open_metadata_store(pg_url, read_only=True)
        try:
            assert await reader.list_node_runtime() == await store.list_node_runtime()
            assert await reader.list_assignments() == await store.list_assignments()
            assert await reader.list_takeovers() == await store.list_takeovers() != []
            with pytest.raises(S3StreamError):
                await reader.request_reassign(stream_ids=[stream_id], to_node_id=b.node_id)
        finally:
            await reader.close()
    finally:
        await store.close()


async def test_a_version_4_schema_gets_the_cluster_tables(pg_url: str, clock: FakeClock) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        assert postgres_schema.migrate(conn, target_version=4) == 0
        conn.execute("INSERT INTO nodes VALUES (1, 3, -1, -1, -1)")
    store = await PostgresMetadataStore.open(pg_url, clock_ms=clock)
    try:
        assert await store.schema_version() >= 5
        assert await store.list_takeovers() == []
        info = await store.open_node(node_id=NodeId(1), lease_ms=LEASE_MS, wal_path="/w")
        assert info.node_epoch == 4
        assert [r.wal_path for r in await store.list_node_runtime()] == ["/w"]
    finally:
        await store.close()


def test_error_codes_of_the_cluster_are_distinct() -> None:
    codes = [
        ErrorCode.NOT_OWNER,
        ErrorCode.STREAM_MOVED,
        ErrorCode.NODE_NOT_ALIVE,
        ErrorCode.NODE_TAKEOVER_IN_PROGRESS,
    ]
    assert [int(c) for c in codes] == [517, 518, 519, 520]
