"""The cluster part of the MetadataStore contract: node runtime, stream ownership, reassignment,
takeovers. One suite, run against every implementation (memory, SQLite, PostgreSQL).

A test module subclasses :class:`ClusterContract` and provides an async ``store`` fixture built on
the ``clock`` fixture (a :class:`~tests.support.metadata_contract.FakeClock`, so leases lapse at will).
"""

from __future__ import annotations

from typing import Any

import pytest

from s3stream.errors import (
    ConflictError,
    ErrorCode,
    FencedError,
    InvalidArgumentError,
    NotFoundError,
    NotOwnerError,
    UnavailableError,
)
from s3stream.ids import NodeId, StreamId
from s3stream.metadata.base import (
    Assignment,
    NodeInfo,
    StreamState,
    TakeoverState,
)
from s3stream.metadata.store import TransactionalStore
from tests.support.metadata_contract import N1, N2, N3, TTL_MS, FakeClock, raises, sso_request

LEASE_MS = 10_000
CONTROLLER = "controller"


async def session(store: TransactionalStore, node_id: NodeId, wal_path: str = "") -> NodeInfo:
    return await store.open_node(node_id=node_id, lease_ms=LEASE_MS, wal_path=wal_path)


async def open_as(store: TransactionalStore, info: NodeInfo, stream_id: StreamId, epoch: int) -> Any:
    return await store.open_stream(
        node_id=info.node_id, node_epoch=info.node_epoch, stream_id=stream_id, epoch=epoch
    )


async def new_stream(store: TransactionalStore, info: NodeInfo, epoch: int = 0) -> StreamId:
    stream_id = await store.create_stream(node_id=info.node_id, node_epoch=info.node_epoch)
    await open_as(store, info, stream_id, epoch)
    return stream_id


async def commit(
    store: TransactionalStore, info: NodeInfo, stream_id: StreamId, start: int, end: int
) -> None:
    object_id = await store.prepare_objects(count=1, ttl_ms=TTL_MS)
    request = sso_request(info.node_id, object_id, [(stream_id, start, end)], node_epoch=info.node_epoch)
    await store.commit_stream_set_object(request)


async def renew(store: TransactionalStore, *infos: NodeInfo) -> None:
    for info in infos:
        await store.heartbeat(node_id=info.node_id, node_epoch=info.node_epoch, lease_ms=LEASE_MS)


async def cluster_state(store: TransactionalStore) -> tuple[Any, ...]:
    return (
        await store.list_streams(),
        await store.list_nodes(),
        await store.list_assignments(),
        await store.list_takeovers(),
    )


class ClusterContract:
    @pytest.fixture
    def clock(self) -> FakeClock:
        return FakeClock()

    # -- node runtime ------------------------------------------------------------------------------

    async def test_open_node_and_heartbeat_record_the_node_runtime(
        self, store: TransactionalStore, clock: FakeClock
    ) -> None:
        assert await store.list_node_runtime() == []
        a = await session(store, N1, "/data/n1/wal")
        await session(store, N2)
        runtimes = await store.list_node_runtime()
        assert [(r.node_id, r.wal_path, r.wal_pending_bytes) for r in runtimes] == [
            (N1, "/data/n1/wal", -1),
            (N2, "", -1),
        ]
        clock.advance(7)
        await store.heartbeat(node_id=N1, node_epoch=a.node_epoch, lease_ms=LEASE_MS, wal_pending_bytes=4096)
        r1 = (await store.list_node_runtime())[0]
        assert (r1.wal_path, r1.wal_pending_bytes, r1.updated_at_ms) == ("/data/n1/wal", 4096, clock.now_ms)
        with pytest.raises(InvalidArgumentError):
            await store.heartbeat(
                node_id=N1, node_epoch=a.node_epoch, lease_ms=LEASE_MS, wal_pending_bytes=-2
            )
        with pytest.raises(InvalidArgumentError):
            await store.open_node(node_id=N3, lease_ms=LEASE_MS, wal_path="x" * 5000)

    # -- ownership -----------------------------------------------------------------------------------

    async def test_open_of_a_stream_open_on_a_live_node_names_the_owner(
        self, store: TransactionalStore, clock: FakeClock
    ) -> None:
        a, b = await session(store, N1), await session(store, N2)
        stream_id = await new_stream(store, a)
        before = await cluster_state(store)
        with pytest.raises(NotOwnerError) as info:
            await open_as(store, b, stream_id, 1)
        assert (info.value.code, info.value.owner_node_id) == (ErrorCode.NOT_OWNER, N1)
        assert not info.value.retriable
        clock.advance(LEASE_MS)  # the owner's lease lapses: retriable, a takeover will free it
        with raises(UnavailableError, ErrorCode.NODE_TAKEOVER_IN_PROGRESS):
            await store.open_stream(node_id=N2, node_epoch=b.node_epoch, stream_id=stream_id, epoch=1)
        assert await cluster_state(store) == before

    # -- reassignment --------------------------------------------------------------------------------

    async def test_request_reassign_writes_one_row_per_stream_and_checks_everything_first(
        self, store: TransactionalStore, clock: FakeClock
    ) -> None:
        a, b = await session(store, N1), await session(store, N2)
        on_a = await new_stream(store, a)
        on_b = await new_stream(store, b)
        closed = await store.create_stream(node_id=N1, node_epoch=a.node_epoch)
        with raises(NotFoundError, ErrorCode.STREAM_NOT_EXIST):
            await store.request_reassign(stream_ids=[on_a, StreamId(99)], to_node_id=N2)
        with raises(NotFoundError, ErrorCode.NODE_NOT_ALIVE):
            await store.request_reassign(stream_ids=[on_a], to_node_id=N3)
        assert await store.list_assignments() == []
        rows = await store.request_reassign(stream_ids=[closed, on_b, on_a], to_node_id=N2)
        now = clock.now_ms
        assert rows == [Assignment(on_a, N2, N1, now), Assignment(closed, N2, -1, now)]
        assert await store.list_assignments() == rows
        await renew(store, a, b)
        assert await store.list_assignments() == rows, "a heartbeat leaves the rows alone"

    async def test_a_later_request_wins_and_a_request_to_the_owner_targets_the_owner(
        self, store: TransactionalStore, clock: FakeClock
    ) -> None:
        a, b = await session(store, N1), await session(store, N2)
        await session(store, N3)
        stream_id = await new_stream(store, a)
        await store.request_reassign(stream_ids=[stream_id], to_node_id=N2)
        clock.advance(1)
        (row,) = await store.request_reassign(stream_ids=[stream_id], to_node_id=N3)
        assert await store.list_assignments() == [Assignment(stream_id, N3, N1, clock.now_ms)]
        assert row == Assignment(stream_id, N3, N1, clock.now_ms)
        clock.advance(1)
        # back to the owner: the row now targets the owner (a move it already started ends with its
        # reopen; one it never started is settled by it)
        assert await store.request_reassign(stream_ids=[stream_id], to_node_id=N1) == [
            Assignment(stream_id, N1, N1, clock.now_ms)
        ]
        assert await store.list_assignments() == [Assignment(stream_id, N1, N1, clock.now_ms)]
        assert not await store.settle_assignment(stream_id=stream_id, node_id=N2, node_epoch=b.node_epoch)
        assert await store.settle_assignment(stream_id=stream_id, node_id=N1, node_epoch=a.node_epoch)
        assert await store.list_assignments() == []

    async def test_a_move_follows_the_assignment_row(
        self, store: TransactionalStore, clock: FakeClock
    ) -> None:
        a, b, c = await session(store, N1), await session(store, N2), await session(store, N3)
        stream_id = await new_stream(store, a)
        await commit(store, a, stream_id, 0, 10)
        await store.request_reassign(stream_ids=[stream_id], to_node_id=N2)
        with pytest.raises(NotOwnerError) as info:  # still open on the old owner
            await open_as(store, b, stream_id, 1)
        assert info.value.owner_node_id == N1
        await store.close_stream(node_id=N1, node_epoch=a.node_epoch, stream_id=stream_id, epoch=0)
        for other in (c, a):  # neither a third node nor the old owner (same epoch) may take it
            with pytest.raises(NotOwnerError) as info:
                await open_as(store, other, stream_id, 0 if other is a else 1)
            assert info.value.owner_node_id == N2
        opened = await open_as(store, b, stream_id, 1)
        assert opened.state == StreamState.OPENED
        assert (opened.epoch, opened.ranges[-1].node_id, opened.ranges[-1].start_offset) == (1, N2, 10)
        assert await store.list_assignments() == []
        await commit(store, b, stream_id, 10, 20)
        with pytest.raises(FencedError):  # the old owner's late upload
            await commit(store, a, stream_id, 20, 30)

    async def test_a_row_for_a_target_without_a_session_is_ignored_and_removed(
        self, store: TransactionalStore, clock: FakeClock
    ) -> None:
        a = await session(store, N1)
        stream_id = await store.create_stream(node_id=N1, node_epoch=a.node_epoch)
        await session(store, N2)
        await store.request_reassign(stream_ids=[stream_id], to_node_id=N2)
        clock.advance(LEASE_MS - 1)
        await renew(store, a)
        clock.advance(1)  # N2's lease lapsed, N1's runs
        await open_as(store, a, stream_id, 0)
        assert await store.list_assignments() == []

    async def test_delete_stream_drops_its_assignment(self, store: TransactionalStore) -> None:
        a = await session(store, N1)
        await session(store, N2)
        stream_id = await store.create_stream(node_id=N1, node_epoch=a.node_epoch)
        await store.request_reassign(stream_ids=[stream_id], to_node_id=N2)
        await store.delete_stream(stream_id=stream_id, epoch=-1)
        assert await store.list_assignments() == []

    # -- takeovers -----------------------------------------------------------------------------------

    async def test_start_takeover_preconditions_write_nothing(
        self, store: TransactionalStore, clock: FakeClock
    ) -> None:
        a, b = await session(store, N1), await session(store, N2)
        await new_stream(store, a)
        before = await cluster_state(store)
        with pytest.raises(ConflictError):  # still alive
            await store.start_takeover(
                node_id=N1, node_epoch=a.node_epoch, taker_node_id=N2, taker_node_epoch=b.node_epoch
            )
        clock.advance(LEASE_MS)
        b = await session(store, N2)  # N2 lapsed too: a new session
        before = await cluster_state(store)
        with pytest.raises(ConflictError):  # not the current epoch
            await store.start_takeover(
                node_id=N1, node_epoch=a.node_epoch - 1, taker_node_id=N2, taker_node_epoch=b.node_epoch
            )
        with raises(NotFoundError, ErrorCode.NODE_NOT_ALIVE):  # the taker's session is not valid
            await store.start_takeover(
                node_id=N1, node_epoch=a.node_epoch, taker_node_id=N2, taker_node_epoch=b.node_epoch - 1
            )
        with raises(NotFoundError, ErrorCode.NODE_NOT_ALIVE):
            await store.start_takeover(
                node_id=N1, node_epoch=a.node_epoch, taker_node_id=N3, taker_node_epoch=1
            )
        with pytest.raises(InvalidArgumentError):
            await store.start_takeover(
                node_id=N1, node_epoch=a.node_epoch, taker_node_id=N1, taker_node_epoch=a.node_epoch
            )
        assert await cluster_state(store) == before

    async def test_start_takeover_fences_snapshots_and_assigns(
        self, store: TransactionalStore, clock: FakeClock
    ) -> None:
        a = await session(store, N1, "/wal/1")
        b, c = await session(store, N2), await session(store, N3)
        s1 = await new_stream(store, a, epoch=4)
        s2 = await new_stream(store, a)
        other = await new_stream(store, b)
        closed = await store.create_stream(node_id=N1, node_epoch=a.node_epoch)
        await store.request_reassign(stream_ids=[closed], to_node_id=N1)
        await store.request_reassign(stream_ids=[other], to_node_id=N3)
        clock.advance(LEASE_MS)
        b, c = await session(store, N2), await session(store, N3)
        takeover = await store.start_takeover(
            node_id=N1, node_epoch=a.node_epoch, taker_node_id=N2, taker_node_epoch=b.node_epoch
        )
        assert takeover.node_id == N1
        assert (takeover.node_epoch, takeover.fence_epoch) == (a.node_epoch, a.node_epoch + 1)
        assert takeover.wal_path == "/wal/1"
        assert takeover.streams == ((s1, 4), (s2, 0))
        assert (takeover.state, takeover.taker_node_id, takeover.taker_node_epoch, takeover.attempt) == (
            TakeoverState.RUNNING, N2, b.node_epoch, 1,
        )  # fmt: skip
        assert (takeover.created_at_ms, takeover.updated_at_ms, takeover.wal_end_offset) == (
            clock.now_ms, clock.now_ms, -1,
        )  # fmt: skip
        assert await store.list_takeovers() == [takeover]
        fenced = next(n for n in await store.list_nodes() if n.node_id == N1)
        assert fenced.node_epoch == a.node_epoch + 1
        assert fenced.lease_expires_at_ms <= clock.now_ms
        assert [r.stream_id for r in await store.list_assignments()] == [
            other
        ]  # the one targeting N1 dropped
        with pytest.raises(FencedError):  # the old session commits nothing
            await commit(store, a, s1, 0, 10)
        with raises(UnavailableError, ErrorCode.NODE_TAKEOVER_IN_PROGRESS):  # the dead node restarting
            await session(store, N1)
        with raises(ConflictError, ErrorCode.NODE_TAKEOVER_IN_PROGRESS):  # one at a time
            await store.start_takeover(
                node_id=N3, node_epoch=c.node_epoch, taker_node_id=N2, taker_node_epoch=b.node_epoch
            )

    async def test_a_node_owning_no_opened_stream_is_done_at_once(
        self, store: TransactionalStore, clock: FakeClock
    ) -> None:
        a = await session(store, N1)
        await store.create_stream(node_id=N1, node_epoch=a.node_epoch)
        clock.advance(LEASE_MS)
        takeover = await store.start_takeover(
            node_id=N1, node_epoch=a.node_epoch, taker_node_id=-1, taker_node_epoch=-1
        )
        assert (takeover.state, takeover.streams, takeover.taker_node_id) == (TakeoverState.DONE, (), -1)
        again = await session(store, N1)
        assert again.node_epoch == a.node_epoch + 2

    async def test_a_pending_takeover_gets_a_taker_later_and_a_lapsed_taker_is_replaced(
        self, store: TransactionalStore, clock: FakeClock
    ) -> None:
        a = await session(store, N1)
        stream_id = await new_stream(store, a)
        await commit(store, a, stream_id, 0, 10)
        clock.advance(LEASE_MS)
        pending = await store.start_takeover(
            node_id=N1, node_epoch=a.node_epoch, taker_node_id=-1, taker_node_epoch=-1
        )
        assert (pending.state, pending.attempt) == (TakeoverState.PENDING, 0)
        with pytest.raises(ConflictError):
            await store.reassign_takeover(node_id=N2, taker_node_id=N3, taker_node_epoch=1)  # none of N2
        t1 = await session(store, N2)
        running = await store.reassign_takeover(node_id=N1, taker_node_id=N2, taker_node_epoch=t1.node_epoch)
        assert (running.state, running.taker_node_id, running.attempt) == (TakeoverState.RUNNING, N2, 1)
        ((taken, dead_epoch),) = await store.takeover_streams(
            node_id=N1, taker_node_id=N2, taker_node_epoch=t1.node_epoch
        )
        assert (dead_epoch, taken.epoch, taken.state) == (0, 1, StreamState.OPENED)
        assert (taken.ranges[-1].node_id, taken.ranges[-1].start_offset) == (N2, 10)
        retried = await store.takeover_streams(node_id=N1, taker_node_id=N2, taker_node_epoch=t1.node_epoch)
        assert retried == [(taken, 0)], "a retry by the same taker changes nothing"
        # the first taker dies mid-way; a second one takes over the same takeover
        clock.advance(LEASE_MS)
        t2 = await session(store, N3)
        second = await store.reassign_takeover(node_id=N1, taker_node_id=N3, taker_node_epoch=t2.node_epoch)
        assert (second.attempt, second.taker_node_id, second.streams) == (2, N3, running.streams)
        ((again, dead_epoch),) = await store.takeover_streams(
            node_id=N1, taker_node_id=N3, taker_node_epoch=t2.node_epoch
        )
        assert (dead_epoch, again.epoch, again.ranges[-1].node_id) == (0, 2, N3)
        with pytest.raises((FencedError, ConflictError)):  # the first taker is out
            await store.takeover_streams(node_id=N1, taker_node_id=N2, taker_node_epoch=t1.node_epoch)
        with pytest.raises(FencedError):
            await commit(store, t1, stream_id, 10, 20)
        await commit(store, t2, stream_id, 10, 20)
        done = await store.finish_takeover(
            node_id=N1, taker_node_id=N3, taker_node_epoch=t2.node_epoch, wal_end_offset=4096
        )
        assert (done.state, done.wal_end_offset, done.attempt) == (TakeoverState.DONE, 4096, 2)
        closed = await store.describe_stream(stream_id)
        assert (closed.state, closed.end_offset) == (StreamState.CLOSED, 20)
        assert await store.list_takeovers() == [done]
        back = await session(store, N1)  # the dead node restarts: it owns nothing
        reopened = await open_as(store, back, stream_id, 3)
        assert (reopened.ranges[-1].node_id, reopened.ranges[-1].start_offset) == (N1, 20)

    async def test_takeover_streams_and_finish_require_the_running_taker(
        self, store: TransactionalStore, clock: FakeClock
    ) -> None:
        a = await session(store, N1)
        await new_stream(store, a)
        clock.advance(LEASE_MS)
        b, c = await session(store, N2), await session(store, N3)
        with pytest.raises(ConflictError):  # no takeover yet
            await store.takeover_streams(node_id=N1, taker_node_id=N2, taker_node_epoch=b.node_epoch)
        await store.start_takeover(
            node_id=N1, node_epoch=a.node_epoch, taker_node_id=N2, taker_node_epoch=b.node_epoch
        )
        before = await cluster_state(store)
        with pytest.raises(ConflictError):
            await store.takeover_streams(node_id=N1, taker_node_id=N3, taker_node_epoch=c.node_epoch)
        with pytest.raises(ConflictError):
            await store.finish_takeover(
                node_id=N1, taker_node_id=N3, taker_node_epoch=c.node_epoch, wal_end_offset=0
            )
        assert await cluster_state(store) == before
        done = await store.finish_takeover(
            node_id=N1, taker_node_id=N2, taker_node_epoch=b.node_epoch, wal_end_offset=0
        )
        assert done.state == TakeoverState.DONE
        with pytest.raises(ConflictError):
            await store.finish_takeover(
                node_id=N1, taker_node_id=N2, taker_node_epoch=b.node_epoch, wal_end_offset=0
            )
        # not taken before finishing: the stream is still the dead node's, OPENED, and free to take over
        (stream,) = [s for s in await store.list_streams() if s.state == StreamState.OPENED]
        assert stream.ranges[-1].node_id == N1

    async def test_takeover_ops_of_a_bound_store_need_the_bound_session_and_lease(
        self, store: TransactionalStore, clock: FakeClock
    ) -> None:
        a = await session(store, N1)
        await new_stream(store, a)
        b = await session(store, N2)
        clock.advance(LEASE_MS - 1)
        await renew(store, b)
        clock.advance(1)
        store.bind_node(N2, b.node_epoch)
        controller = store.bind_lease(CONTROLLER)
        with pytest.raises(FencedError):  # N2 does not hold the controller lease
            await controller.start_takeover(
                node_id=N1, node_epoch=a.node_epoch, taker_node_id=N2, taker_node_epoch=b.node_epoch
            )
        await store.acquire_lease(name=CONTROLLER, node_id=N2, node_epoch=b.node_epoch, lease_ms=LEASE_MS)
        takeover = await controller.start_takeover(
            node_id=N1, node_epoch=a.node_epoch, taker_node_id=N2, taker_node_epoch=b.node_epoch
        )
        assert takeover.state == TakeoverState.RUNNING
        assert len(await controller.list_takeovers()) == 1
        assert (
            len(await store.takeover_streams(node_id=N1, taker_node_id=N2, taker_node_epoch=b.node_epoch))
            == 1
        )

    # -- assignments that cannot finish, takeover attempts that fail (decisions 0045, 0046) ------------
    async def test_redirect_sends_rows_of_a_gone_target_elsewhere_in_one_transaction(
        self, store: TransactionalStore, clock: FakeClock
    ) -> None:
        a, b = await session(store, N1), await session(store, N2)
        c = await session(store, N3)
        moving = await new_stream(store, a)
        staying = await new_stream(store, a)
        await store.request_reassign(stream_ids=[moving], to_node_id=N2)
        await store.request_reassign(stream_ids=[staying], to_node_id=N3)
        await store.close_stream(node_id=N1, node_epoch=a.node_epoch, stream_id=moving, epoch=0)
        await store.close_node(node_id=N2, node_epoch=b.node_epoch)  # N2 goes before it gains
        with raises(NotFoundError, ErrorCode.NODE_NOT_ALIVE):  # the new target must be alive
            await store.redirect_assignments(stream_ids=[moving], to_node_id=N2)
        clock.advance(1)
        written = await store.redirect_assignments(stream_ids=[moving, staying], to_node_id=N1)
        assert written == [Assignment(moving, N1, N1, clock.now_ms)], "a row to a live target stays"
        assert [r.to_node_id for r in await store.list_assignments()] == [N1, N3]
        reopened = await open_as(store, a, moving, 1)  # the open removes the row
        assert reopened.state == StreamState.OPENED
        assert [r.stream_id for r in await store.list_assignments()] == [staying]
        assert c.node_id == N3

    async def test_progress_give_back_and_fail_free_the_slot_and_hand_streams_back(
        self, store: TransactionalStore, clock: FakeClock
    ) -> None:
        a = await session(store, N1)
        stream_id = await new_stream(store, a)
        await commit(store, a, stream_id, 0, 10)
        clock.advance(LEASE_MS)
        b = await session(store, N2)
        await store.start_takeover(
            node_id=N1, node_epoch=a.node_epoch, taker_node_id=N2, taker_node_epoch=b.node_epoch
        )
        await store.takeover_streams(node_id=N1, taker_node_id=N2, taker_node_epoch=b.node_epoch)
        clock.advance(5)
        moved = await store.report_takeover_progress(
            node_id=N1, taker_node_id=N2, taker_node_epoch=b.node_epoch
        )
        assert moved.updated_at_ms == clock.now_ms
        back = await store.give_back_takeover(node_id=N1, taker_node_id=N2, taker_node_epoch=b.node_epoch)
        assert (back.state, back.taker_node_id, back.attempt) == (TakeoverState.PENDING, -1, 1)
        with pytest.raises(ConflictError):  # no longer its attempt
            await store.report_takeover_progress(node_id=N1, taker_node_id=N2, taker_node_epoch=b.node_epoch)
        with raises(UnavailableError, ErrorCode.NODE_TAKEOVER_IN_PROGRESS):
            await session(store, N1)
        failed = await store.fail_takeover(node_id=N1)
        assert (failed.state, failed.taker_node_id, failed.attempt) == (TakeoverState.FAILED, -1, 1)
        with pytest.raises(ConflictError):
            await store.fail_takeover(node_id=N1)
        handed = await store.describe_stream(stream_id)
        assert (handed.state, handed.epoch, handed.ranges[-1].node_id) == (StreamState.OPENED, 2, N1)
        with pytest.raises(FencedError):  # the taker is off the stream
            await commit(store, b, stream_id, 10, 20)
        # the slot is free: another lapsed node can be taken over; the dead node may come back
        c = await session(store, N3)
        await new_stream(store, c)
        clock.advance(LEASE_MS)
        b = await session(store, N2)
        started = await store.start_takeover(
            node_id=N3, node_epoch=c.node_epoch, taker_node_id=N2, taker_node_epoch=b.node_epoch
        )
        assert started.state == TakeoverState.RUNNING
        again = await session(store, N1)
        opening = await store.register_node(node_id=N1, node_epoch=again.node_epoch)
        assert [m.stream_id for m in opening] == [stream_id]

    async def test_finish_marks_what_the_taker_read_as_applied_kv(
        self, store: TransactionalStore, clock: FakeClock
    ) -> None:
        a = await session(store, N1)
        await new_stream(store, a)
        clock.advance(LEASE_MS)
        b = await session(store, N2)
        await store.start_takeover(
            node_id=N1, node_epoch=a.node_epoch, taker_node_id=N2, taker_node_epoch=b.node_epoch
        )
        assert await store.kv_applied_offset(N1) == -1
        await store.finish_takeover(
            node_id=N1, taker_node_id=N2, taker_node_epoch=b.node_epoch, wal_end_offset=7
        )
        assert await store.kv_applied_offset(N1) == 6

    # -- batched opens and closes (open_streams, close_streams) -------------------------------------

    async def test_open_streams_opens_many_with_per_stream_outcomes(
        self, store: TransactionalStore, clock: FakeClock
    ) -> None:
        a, b, c = await session(store, N1), await session(store, N2), await session(store, N3)
        moved = [await new_stream(store, a) for _ in range(3)]
        await commit(store, a, moved[0], 0, 10)
        elsewhere = await new_stream(store, c)  # open on a live third node
        to_c = await store.create_stream(node_id=N1, node_epoch=a.node_epoch)  # CLOSED, row targets c
        fenced = await store.create_stream(node_id=N1, node_epoch=a.node_epoch)
        await open_as(store, a, fenced, 5)
        await store.close_stream(node_id=N1, node_epoch=a.node_epoch, stream_id=fenced, epoch=5)
        await store.request_reassign(stream_ids=[*moved], to_node_id=N2)
        await store.request_reassign(stream_ids=[to_c], to_node_id=N3)
        closed = await store.close_streams(
            node_id=N1, node_epoch=a.node_epoch, requests=[(sid, 0) for sid in moved]
        )
        assert [(o.stream_id, o.stream, o.error) for o in closed] == [(sid, None, None) for sid in moved]
        before_refused = [await store.describe_stream(sid) for sid in (elsewhere, to_c, fenced)]
        outcomes = await store.open_streams(
            node_id=N2,
            node_epoch=b.node_epoch,
            requests=[(moved[0], 1), (elsewhere, 1), (moved[1], 1), (to_c, 1), (fenced, 4), (moved[2], 1)],
        )
        assert [o.stream_id for o in outcomes] == [moved[0], elsewhere, moved[1], to_c, fenced, moved[2]]
        ok = {o.stream_id: o.stream for o in outcomes if o.error is None}
        assert sorted(ok) == sorted(moved)
        first = ok[moved[0]]
        assert first is not None
        assert (first.state, first.epoch, first.ranges[-1].node_id, first.ranges[-1].start_offset) == (
            StreamState.OPENED,
            1,
            N2,
            10,
        )
        errors = {o.stream_id: o.error for o in outcomes if o.error is not None}
        for refused_by_c in (errors[elsewhere], errors[to_c]):  # open on c; moving to c
            assert isinstance(refused_by_c, NotOwnerError)
            assert refused_by_c.owner_node_id == N3
        assert isinstance(errors[fenced], FencedError)
        assert errors[fenced].code == ErrorCode.STREAM_FENCED
        # the opened streams' rows went in the same transaction; the refused ones wrote nothing
        assert [r.stream_id for r in await store.list_assignments()] == [to_c]
        assert [await store.describe_stream(sid) for sid in (elsewhere, to_c, fenced)] == before_refused
        for sid in moved:
            meta = await store.describe_stream(sid)
            assert (meta.state, meta.epoch, meta.ranges[-1].node_id) == (StreamState.OPENED, 1, N2)
        # a retried batch is a retry of each open (same epoch, same owner)
        again = await store.open_streams(
            node_id=N2, node_epoch=b.node_epoch, requests=[(sid, 1) for sid in moved]
        )
        assert [o.error for o in again] == [None, None, None]

    async def test_close_streams_checks_ownership_per_stream(
        self, store: TransactionalStore, clock: FakeClock
    ) -> None:
        a, b = await session(store, N1), await session(store, N2)
        mine = [await new_stream(store, a) for _ in range(2)]
        theirs = await new_stream(store, b)
        outcomes = await store.close_streams(
            node_id=N1,
            node_epoch=a.node_epoch,
            requests=[(mine[0], 0), (theirs, 0), (mine[1], 0), (StreamId(99), 0)],
        )
        assert [o.error is None for o in outcomes] == [True, False, True, False]
        assert isinstance(outcomes[1].error, FencedError)
        assert isinstance(outcomes[3].error, NotFoundError)
        states = [(await store.describe_stream(sid)).state for sid in (*mine, theirs)]
        assert states == [StreamState.CLOSED, StreamState.CLOSED, StreamState.OPENED]
        again = await store.close_streams(node_id=N1, node_epoch=a.node_epoch, requests=[(mine[0], 0)])
        assert again[0].error is None, "closing a CLOSED stream is a no-op"

    async def test_batches_refuse_bad_arguments_and_a_fenced_session_whole(
        self, store: TransactionalStore, clock: FakeClock
    ) -> None:
        a = await session(store, N1)
        sid = await store.create_stream(node_id=N1, node_epoch=a.node_epoch)
        other = await store.create_stream(node_id=N1, node_epoch=a.node_epoch)
        before = await cluster_state(store)
        for requests in ([(sid, 0), (sid, 1)], [(sid, -1)], [(sid, 0), (StreamId(-3), 0)]):
            with pytest.raises(InvalidArgumentError):
                await store.open_streams(node_id=N1, node_epoch=a.node_epoch, requests=requests)
            with pytest.raises(InvalidArgumentError):
                await store.close_streams(node_id=N1, node_epoch=a.node_epoch, requests=requests)
        again = await session(store, N1)  # a new epoch: the old session is fenced
        with pytest.raises(FencedError) as info:
            await store.open_streams(node_id=N1, node_epoch=a.node_epoch, requests=[(sid, 0), (other, 0)])
        assert info.value.code in (ErrorCode.NODE_EPOCH_EXPIRED, ErrorCode.NODE_FENCED)
        after = await cluster_state(store)
        assert after[0] == before[0]
        assert after[2:] == before[2:]
        assert await store.open_streams(node_id=N1, node_epoch=again.node_epoch, requests=[]) == []
        opened = await store.open_streams(
            node_id=N1, node_epoch=again.node_epoch, requests=[(sid, 0), (other, 0)]
        )
        assert [o.error for o in opened] == [None, None]
