"""The MetadataStore contract: one suite, run against every implementation.

A test module subclasses :class:`MetadataContract` and provides an async ``store`` fixture built on
the ``clock`` fixture (a :class:`FakeClock`, so prepared-object deadlines can be crossed at will).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

import pytest

from s3stream.errors import (
    ClosedError,
    ConflictError,
    ErrorCode,
    FencedError,
    InvalidArgumentError,
    NotFoundError,
    NotOwnerError,
    OffsetOutOfRangeError,
    S3StreamError,
)
from s3stream.ids import NOOP_OBJECT_ID, NodeId, ObjectId, StreamId
from s3stream.metadata.base import (
    CommitStreamObjectRequest,
    CommitStreamSetObjectRequest,
    LeaseInfo,
    MetadataStore,
    NewStreamObject,
    NodeInfo,
    ObjectKind,
    ObjectSlice,
    ObjectState,
    RangeMetadata,
    StreamOffsetRange,
    StreamState,
)
from s3stream.metadata.store import TransactionalStore

N1, N2, N3 = NodeId(1), NodeId(2), NodeId(3)
LEASE_MS = 10_000
"""A node session's lease in the node and lease tests."""
LEASE = "maintenance"
EPOCH = 7
"""The node epoch every test node registers with."""
TTL_MS = 60_000
START_MS = 1_000_000


class FakeClock:
    def __init__(self, now_ms: int = START_MS) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, ms: int) -> None:
        self.now_ms += ms


@contextlib.contextmanager
def raises(kind: type[S3StreamError], code: ErrorCode) -> Iterator[None]:
    with pytest.raises(kind) as info:
        yield
    assert info.value.code == code, f"expected {code.name}, got {info.value.code.name}: {info.value}"


async def snapshot(store: MetadataStore, keys: Sequence[str] = ("a", "b")) -> tuple[Any, ...]:
    """Everything observable, for before/after comparisons."""
    streams = await store.list_streams()
    stream_objects = [
        await store.get_stream_objects(stream_id=s.stream_id, start_offset=0, end_offset=-1, limit=1000)
        for s in streams
    ]
    ssos = [await store.get_stream_set_objects(n) for n in (N1, N2, N3)]
    kvs = [await store.kv_get(k) for k in keys]
    return streams, await store.list_objects(), ssos, stream_objects, kvs


async def nodes_and_leases(store: MetadataStore, names: Sequence[str]) -> tuple[Any, ...]:
    """The node sessions and the valid holders of the named leases, for comparisons."""
    return await store.list_nodes(), [await store.get_lease(name) for name in names]


async def node(store: MetadataStore, *node_ids: NodeId) -> None:
    for node_id in node_ids or (N1,):
        await store.register_node(node_id=node_id, node_epoch=EPOCH)


async def opened(store: MetadataStore, node_id: NodeId = N1, epoch: int = 0) -> StreamId:
    stream_id = await store.create_stream(node_id=node_id, node_epoch=EPOCH)
    await store.open_stream(node_id=node_id, node_epoch=EPOCH, stream_id=stream_id, epoch=epoch)
    return stream_id


def sso_request(
    node_id: NodeId,
    object_id: ObjectId,
    ranges: Sequence[tuple[int, int, int]],
    stream_objects: Sequence[tuple[int, int, int, int]] = (),
    *,
    compacted: Sequence[int] = (),
    order_id: int | None = None,
    size_bytes: int = 1000,
    node_epoch: int = EPOCH,
) -> CommitStreamSetObjectRequest:
    """ranges: (stream, start, end); stream_objects: (object id, stream, start, end)."""
    return CommitStreamSetObjectRequest(
        node_id=node_id,
        node_epoch=node_epoch,
        object_id=object_id,
        order_id=object_id if order_id is None else order_id,
        object_size_bytes=size_bytes if object_id != NOOP_OBJECT_ID else 0,
        stream_ranges=tuple(StreamOffsetRange(StreamId(s), a, b, (b - a) * 10) for s, a, b in ranges),
        stream_objects=tuple(
            NewStreamObject(ObjectId(o), StreamId(s), a, b, (b - a) * 10) for o, s, a, b in stream_objects
        ),
        compacted_object_ids=tuple(ObjectId(c) for c in compacted),
    )


async def upload(
    store: MetadataStore,
    node_id: NodeId,
    ranges: Sequence[tuple[int, int, int]],
    stream_objects: Sequence[tuple[int, int, int]] = (),
) -> ObjectId:
    """Prepare and commit one WAL upload; stream_objects: (stream, start, end). Returns the SSO id."""
    first = await store.prepare_objects(count=1 + len(stream_objects), ttl_ms=TTL_MS)
    sos = [(first + 1 + i, s, a, b) for i, (s, a, b) in enumerate(stream_objects)]
    await store.commit_stream_set_object(sso_request(node_id, first, ranges, sos))
    return first


def spans(slices: Sequence[ObjectSlice]) -> list[tuple[int, ObjectKind, int, int]]:
    return [(s.object_id, s.kind, s.start_offset, s.end_offset) for s in slices]


async def _bound_writes(
    store: TransactionalStore, clock: FakeClock
) -> list[tuple[str, Callable[[], Awaitable[Any]]]]:
    """Bind ``store`` to a fresh session of N1 (epoch 1, lease LEASE_MS), prepare a state in which
    each write kind can succeed once, in this order, and return one call per kind."""
    session = await store.open_node(node_id=N1, lease_ms=LEASE_MS)
    e = session.node_epoch
    store.bind_node(N1, e)
    s0 = await store.create_stream(node_id=N1, node_epoch=e)  # opened, holds data
    await store.open_stream(node_id=N1, node_epoch=e, stream_id=s0, epoch=0)
    s1 = await store.create_stream(node_id=N1, node_epoch=e)  # closed, to delete
    await store.open_stream(node_id=N1, node_epoch=e, stream_id=s1, epoch=0)
    await store.close_stream(node_id=N1, node_epoch=e, stream_id=s1, epoch=0)
    s2 = await store.create_stream(node_id=N1, node_epoch=e)  # never opened, to open
    sso = await upload(store, N1, [(s0, 0, 10)], [(s0, 10, 20)])  # objects 0 and 1
    prepared = await store.prepare_objects(count=3, ttl_ms=TTL_MS)  # 2, 3, 4
    await store.mark_destroyed([ObjectId(prepared + 2)], now_ms=clock.now_ms)
    await store.kv_put("a", b"1")
    commit_so = CommitStreamObjectRequest(
        object_id=ObjectId(prepared + 1), object_size_bytes=100, stream_id=s0, stream_epoch=0,
        start_offset=10, end_offset=20, source_object_ids=(ObjectId(sso + 1),), node_id=N1, node_epoch=e,
    )  # fmt: skip
    return [
        ("create_stream", lambda: store.create_stream(node_id=N1, node_epoch=e)),
        ("open_stream", lambda: store.open_stream(node_id=N1, node_epoch=e, stream_id=s2, epoch=0)),
        ("trim_stream", lambda: store.trim_stream(node_id=N1, node_epoch=e, stream_id=s0, epoch=0, new_start_offset=5)),
        ("commit_stream_set_object", lambda: store.commit_stream_set_object(sso_request(N1, prepared, [(s0, 20, 30)], node_epoch=e))),
        ("commit_stream_object", lambda: store.commit_stream_object(commit_so)),
        ("close_stream", lambda: store.close_stream(node_id=N1, node_epoch=e, stream_id=s0, epoch=0)),
        ("delete_stream", lambda: store.delete_stream(stream_id=s1, epoch=0)),
        ("prepare_objects", lambda: store.prepare_objects(count=1, ttl_ms=TTL_MS)),
        ("expire_prepared", lambda: store.expire_prepared(now_ms=clock.now_ms)),
        ("mark_destroyed", lambda: store.mark_destroyed([sso], now_ms=clock.now_ms)),
        ("remove_objects", lambda: store.remove_objects([ObjectId(prepared + 2)])),
        ("kv_put", lambda: store.kv_put("b", b"2")),
        ("kv_delete", lambda: store.kv_delete("a")),
    ]  # fmt: skip


class MetadataContract:
    """Every operation, precondition and error code of the MetadataStore protocol."""

    @pytest.fixture
    def clock(self) -> FakeClock:
        return FakeClock()

    # -- nodes --------------------------------------------------------------------------------

    async def test_register_node_fences_an_older_epoch(self, store: MetadataStore) -> None:
        assert await store.register_node(node_id=N1, node_epoch=5) == []
        assert await store.register_node(node_id=N1, node_epoch=5) == []
        await store.register_node(node_id=N1, node_epoch=9)
        with raises(FencedError, ErrorCode.NODE_EPOCH_EXPIRED):
            await store.register_node(node_id=N1, node_epoch=8)

    async def test_register_node_returns_the_opened_streams_it_owns(self, store: MetadataStore) -> None:
        await node(store, N1, N2)
        mine = await opened(store, N1)
        await opened(store, N2)
        closed = await opened(store, N1)
        await store.close_stream(node_id=N1, node_epoch=EPOCH, stream_id=closed, epoch=0)
        streams = await store.register_node(node_id=N1, node_epoch=EPOCH + 1)
        assert [s.stream_id for s in streams] == [mine]
        assert streams[0] == await store.describe_stream(mine)

    async def test_operations_of_an_unknown_node_fail(self, store: MetadataStore) -> None:
        with raises(NotFoundError, ErrorCode.NODE_EPOCH_NOT_EXIST):
            await store.create_stream(node_id=N1, node_epoch=EPOCH)
        await node(store)
        stream_id = await opened(store)
        with raises(NotFoundError, ErrorCode.NODE_EPOCH_NOT_EXIST):
            await store.close_stream(node_id=N2, node_epoch=EPOCH, stream_id=stream_id, epoch=0)

    async def test_operations_with_an_expired_node_epoch_are_fenced(self, store: MetadataStore) -> None:
        await node(store)
        stream_id = await opened(store)
        await store.register_node(node_id=N1, node_epoch=EPOCH + 1)
        before = await snapshot(store)
        object_id = await store.prepare_objects(count=1, ttl_ms=TTL_MS)
        calls = [
            store.create_stream(node_id=N1, node_epoch=EPOCH),
            store.open_stream(node_id=N1, node_epoch=EPOCH, stream_id=stream_id, epoch=1),
            store.close_stream(node_id=N1, node_epoch=EPOCH, stream_id=stream_id, epoch=0),
            store.trim_stream(node_id=N1, node_epoch=EPOCH, stream_id=stream_id, epoch=0, new_start_offset=0),
            store.commit_stream_set_object(sso_request(N1, object_id, [(stream_id, 0, 10)])),
        ]
        for call in calls:
            with raises(FencedError, ErrorCode.NODE_EPOCH_EXPIRED):
                await call
        streams, objects, *rest = await snapshot(store)
        assert (streams, *rest) == (before[0], *before[2:])
        assert [o.state for o in objects] == [ObjectState.PREPARED]

    # -- node sessions, leases and fencing ------------------------------------------------------

    async def test_open_node_issues_monotonic_epochs_from_the_database(
        self, store: TransactionalStore, clock: FakeClock
    ) -> None:
        first = await store.open_node(node_id=N1, lease_ms=LEASE_MS)
        assert first == NodeInfo(N1, 1, START_MS + LEASE_MS, START_MS, START_MS)
        clock.advance(5)
        second = await store.open_node(node_id=N1, lease_ms=LEASE_MS)
        assert second == NodeInfo(N1, 2, START_MS + 5 + LEASE_MS, START_MS + 5, START_MS + 5)
        clock.now_ms = START_MS - 50_000  # the clock steps back: the epoch still goes up
        assert (await store.open_node(node_id=N1, lease_ms=LEASE_MS)).node_epoch == 3
        await store.register_node(node_id=N2, node_epoch=1_700_000_000_000)  # a wall-clock epoch
        assert (await store.open_node(node_id=N2, lease_ms=LEASE_MS)).node_epoch == 1_700_000_000_001

    async def test_a_new_epoch_fences_the_older_session(self, store: TransactionalStore) -> None:
        old = await store.open_node(node_id=N1, lease_ms=LEASE_MS)
        new = await store.open_node(node_id=N1, lease_ms=LEASE_MS)
        with raises(FencedError, ErrorCode.NODE_FENCED):
            await store.heartbeat(node_id=N1, node_epoch=old.node_epoch, lease_ms=LEASE_MS)
        with raises(FencedError, ErrorCode.NODE_FENCED):  # an epoch never issued is no session
            await store.heartbeat(node_id=N1, node_epoch=new.node_epoch + 1, lease_ms=LEASE_MS)
        assert (
            await store.heartbeat(node_id=N1, node_epoch=new.node_epoch, lease_ms=LEASE_MS)
        ).node_epoch == 2
        with raises(FencedError, ErrorCode.NODE_FENCED):  # an unknown node has no session
            await store.heartbeat(node_id=N2, node_epoch=1, lease_ms=LEASE_MS)

    async def test_heartbeat_renews_and_an_expired_lease_is_never_revived(
        self, store: TransactionalStore, clock: FakeClock
    ) -> None:
        session = await store.open_node(node_id=N1, lease_ms=LEASE_MS)
        clock.advance(LEASE_MS - 1)
        renewed = await store.heartbeat(node_id=N1, node_epoch=session.node_epoch, lease_ms=2 * LEASE_MS)
        assert renewed == NodeInfo(N1, 1, clock.now_ms + 2 * LEASE_MS, clock.now_ms, START_MS)
        assert await store.list_nodes() == [renewed]
        clock.advance(2 * LEASE_MS)  # exactly at expiry: expired
        with raises(FencedError, ErrorCode.NODE_FENCED):
            await store.heartbeat(node_id=N1, node_epoch=1, lease_ms=LEASE_MS)
        assert await store.list_nodes() == [renewed]
        assert (await store.open_node(node_id=N1, lease_ms=LEASE_MS)).node_epoch == 2

    async def test_an_unleased_session_takes_a_lease_at_its_first_heartbeat(
        self, store: TransactionalStore, clock: FakeClock
    ) -> None:
        await store.register_node(node_id=N1, node_epoch=EPOCH)
        assert await store.list_nodes() == [NodeInfo(N1, EPOCH, -1, -1, START_MS)]
        clock.advance(10 * LEASE_MS)  # no lease: nothing expires
        info = await store.heartbeat(node_id=N1, node_epoch=EPOCH, lease_ms=LEASE_MS)
        assert info == NodeInfo(N1, EPOCH, clock.now_ms + LEASE_MS, clock.now_ms, START_MS)
        opened_session = await store.open_node(node_id=N1, lease_ms=LEASE_MS)
        assert await store.register_node(node_id=N1, node_epoch=opened_session.node_epoch) == []
        assert await store.list_nodes() == [opened_session]  # the same epoch writes nothing

    async def test_close_node_ends_the_session_and_releases_its_leases(
        self, store: TransactionalStore, clock: FakeClock
    ) -> None:
        s1 = await store.open_node(node_id=N1, lease_ms=LEASE_MS)
        s2 = await store.open_node(node_id=N2, lease_ms=LEASE_MS)
        await store.acquire_lease(name=LEASE, node_id=N1, node_epoch=s1.node_epoch, lease_ms=LEASE_MS)
        await store.acquire_lease(name="other", node_id=N2, node_epoch=s2.node_epoch, lease_ms=LEASE_MS)
        clock.advance(10)
        await store.close_node(node_id=N1, node_epoch=s1.node_epoch)
        assert (await store.list_nodes())[0] == NodeInfo(N1, 1, clock.now_ms, START_MS, START_MS)
        assert await store.get_lease(LEASE) is None
        assert await store.get_lease("other") == LeaseInfo("other", N2, 1, START_MS + LEASE_MS)
        with raises(FencedError, ErrorCode.NODE_FENCED):
            await store.heartbeat(node_id=N1, node_epoch=1, lease_ms=LEASE_MS)
        before = await store.list_nodes()
        clock.advance(10)
        await store.close_node(node_id=N1, node_epoch=1)  # already fenced: a no-op
        await store.close_node(node_id=N2, node_epoch=7)  # not its session: a no-op
        assert await store.list_nodes() == before
        await store.close_node(node_id=N3, node_epoch=1)  # an unknown node: a no-op
        assert await store.list_nodes() == before

    async def test_list_nodes_by_id(self, store: TransactionalStore) -> None:
        assert await store.list_nodes() == []
        for node_id in (N3, N1, N2):
            await store.open_node(node_id=node_id, lease_ms=LEASE_MS)
        await store.open_node(node_id=N3, lease_ms=LEASE_MS)
        assert [(n.node_id, n.node_epoch) for n in await store.list_nodes()] == [(N1, 1), (N2, 1), (N3, 2)]

    async def test_node_and_lease_arguments_are_checked(self, store: TransactionalStore) -> None:
        session = await store.open_node(node_id=N1, lease_ms=LEASE_MS)
        epoch = session.node_epoch
        calls: list[Any] = [
            store.open_node(node_id=NodeId(-1), lease_ms=LEASE_MS),
            store.open_node(node_id=N1, lease_ms=0),
            store.open_node(node_id=N1, lease_ms=25 * 3600 * 1000),
            store.heartbeat(node_id=N1, node_epoch=-1, lease_ms=LEASE_MS),
            store.heartbeat(node_id=N1, node_epoch=epoch, lease_ms=-5),
            store.acquire_lease(name="", node_id=N1, node_epoch=epoch, lease_ms=LEASE_MS),
            store.acquire_lease(name="x" * 257, node_id=N1, node_epoch=epoch, lease_ms=LEASE_MS),
            store.acquire_lease(name="\ud800", node_id=N1, node_epoch=epoch, lease_ms=LEASE_MS),
            store.acquire_lease(name=LEASE, node_id=N1, node_epoch=epoch, lease_ms=0),
            store.release_lease(name=7, node_id=N1, node_epoch=epoch),  # type: ignore[arg-type]
            store.get_lease(""),
        ]
        for call in calls:
            with pytest.raises(InvalidArgumentError):
                await call
        with pytest.raises(InvalidArgumentError):
            store.bind_node(N1, -1)
        with pytest.raises(InvalidArgumentError):
            store.bind_lease(LEASE)  # not bound to a session yet
        assert await store.list_nodes() == [session]

    async def test_acquire_renew_and_take_an_expired_lease(
        self, store: TransactionalStore, clock: FakeClock
    ) -> None:
        a = await store.open_node(node_id=N1, lease_ms=10 * LEASE_MS)
        b = await store.open_node(node_id=N2, lease_ms=10 * LEASE_MS)
        assert await store.get_lease(LEASE) is None
        held = await store.acquire_lease(name=LEASE, node_id=N1, node_epoch=a.node_epoch, lease_ms=LEASE_MS)
        assert held == LeaseInfo(LEASE, N1, 1, START_MS + LEASE_MS)
        assert (
            await store.acquire_lease(name=LEASE, node_id=N2, node_epoch=b.node_epoch, lease_ms=LEASE_MS)
            == held
        )
        clock.advance(LEASE_MS - 1)
        renewed = await store.acquire_lease(name=LEASE, node_id=N1, node_epoch=1, lease_ms=LEASE_MS)
        assert renewed == LeaseInfo(LEASE, N1, 1, clock.now_ms + LEASE_MS)
        assert await store.get_lease(LEASE) == renewed
        clock.advance(LEASE_MS)  # expired exactly now
        assert await store.get_lease(LEASE) is None
        taken = await store.acquire_lease(name=LEASE, node_id=N2, node_epoch=1, lease_ms=LEASE_MS)
        assert taken == LeaseInfo(LEASE, N2, 1, clock.now_ms + LEASE_MS)
        assert await store.acquire_lease(name=LEASE, node_id=N1, node_epoch=1, lease_ms=LEASE_MS) == taken
        assert await store.get_lease(LEASE) == taken

    @pytest.mark.parametrize("fence", ["new epoch", "node lease expired", "node closed"])
    async def test_a_lease_held_by_a_fenced_session_can_be_taken(
        self, store: TransactionalStore, clock: FakeClock, fence: str
    ) -> None:
        await store.open_node(node_id=N1, lease_ms=LEASE_MS)
        await store.open_node(node_id=N2, lease_ms=100 * LEASE_MS)
        await store.acquire_lease(name=LEASE, node_id=N1, node_epoch=1, lease_ms=50 * LEASE_MS)
        if fence == "new epoch":
            await store.open_node(node_id=N1, lease_ms=LEASE_MS)
        elif fence == "node lease expired":
            clock.advance(LEASE_MS)
        else:
            await store.close_node(node_id=N1, node_epoch=1)
        assert await store.get_lease(LEASE) is None
        taken = await store.acquire_lease(name=LEASE, node_id=N2, node_epoch=1, lease_ms=LEASE_MS)
        assert (taken.node_id, taken.node_epoch) == (N2, 1)
        with raises(FencedError, ErrorCode.NODE_FENCED):  # the fenced session cannot take it back
            await store.acquire_lease(name=LEASE, node_id=N1, node_epoch=1, lease_ms=LEASE_MS)
        assert await store.get_lease(LEASE) == taken

    async def test_acquire_needs_a_registered_valid_session(self, store: TransactionalStore) -> None:
        with raises(FencedError, ErrorCode.NODE_FENCED):  # an unknown node has no session
            await store.acquire_lease(name=LEASE, node_id=N1, node_epoch=1, lease_ms=LEASE_MS)
        await store.open_node(node_id=N1, lease_ms=LEASE_MS)
        with raises(FencedError, ErrorCode.NODE_FENCED):
            await store.acquire_lease(name=LEASE, node_id=N1, node_epoch=2, lease_ms=LEASE_MS)
        assert await store.get_lease(LEASE) is None

    async def test_release_frees_only_the_holder_s_lease(self, store: TransactionalStore) -> None:
        await store.open_node(node_id=N1, lease_ms=LEASE_MS)
        await store.open_node(node_id=N2, lease_ms=LEASE_MS)
        held = await store.acquire_lease(name=LEASE, node_id=N1, node_epoch=1, lease_ms=LEASE_MS)
        await store.release_lease(name=LEASE, node_id=N2, node_epoch=1)
        await store.release_lease(name="unknown", node_id=N1, node_epoch=1)
        assert await store.get_lease(LEASE) == held
        await store.release_lease(name=LEASE, node_id=N1, node_epoch=1)
        assert await store.get_lease(LEASE) is None
        taken = await store.acquire_lease(name=LEASE, node_id=N2, node_epoch=1, lease_ms=LEASE_MS)
        assert (taken.node_id, taken.node_epoch) == (N2, 1)

    async def test_a_bound_store_writes_every_kind_while_its_session_is_valid(
        self, store: TransactionalStore, clock: FakeClock
    ) -> None:
        writes = await _bound_writes(store, clock)
        for name, call in writes:
            try:
                await call()
            except S3StreamError as exc:  # pragma: no cover - the message names the write
                raise AssertionError(f"{name} failed: {exc!r}") from exc
        assert [n.node_epoch for n in await store.list_nodes()] == [1]

    @pytest.mark.parametrize("fence", ["new epoch", "node lease expired", "node closed"])
    async def test_a_bound_store_refuses_every_write_kind_once_fenced(
        self, store: TransactionalStore, clock: FakeClock, fence: str
    ) -> None:
        writes = await _bound_writes(store, clock)
        if fence == "new epoch":
            await store.open_node(node_id=N1, lease_ms=LEASE_MS)
        elif fence == "node lease expired":
            clock.advance(LEASE_MS)
        else:
            await store.close_node(node_id=N1, node_epoch=1)
        before = await snapshot(store)
        for _, call in writes:
            with raises(FencedError, ErrorCode.NODE_FENCED):
                await call()
        assert await snapshot(store) == before
        assert (await store.describe_stream(StreamId(0))).end_offset == 20  # reads are never fenced

    async def test_a_store_bound_to_an_unregistered_node_writes_nothing(
        self, store: TransactionalStore
    ) -> None:
        store.bind_node(N2, 1)
        with raises(FencedError, ErrorCode.NODE_FENCED):
            await store.kv_put("a", b"1")
        assert await store.kv_get("a") is None

    async def test_binding_the_new_session_lets_the_node_write_again(
        self, store: TransactionalStore, clock: FakeClock
    ) -> None:
        old = await store.open_node(node_id=N1, lease_ms=LEASE_MS)
        store.bind_node(N1, old.node_epoch)
        assert store.bound_session == (N1, 1)
        await store.kv_put("a", b"1")
        clock.advance(LEASE_MS)
        with raises(FencedError, ErrorCode.NODE_FENCED):
            await store.kv_put("a", b"2")
        new = await store.open_node(node_id=N1, lease_ms=LEASE_MS)  # node operations are not guarded
        store.bind_node(N1, new.node_epoch)
        await store.kv_put("a", b"3")
        assert await store.kv_get("a") == b"3"

    async def test_a_lease_bound_view_writes_only_while_its_session_holds_the_lease(
        self, store: TransactionalStore, clock: FakeClock
    ) -> None:
        a = await store.open_node(node_id=N1, lease_ms=100 * LEASE_MS)
        b = await store.open_node(node_id=N2, lease_ms=100 * LEASE_MS)
        store.bind_node(N1, a.node_epoch)
        maintenance = store.bind_lease(LEASE)
        with raises(FencedError, ErrorCode.NODE_FENCED):  # not acquired yet
            await maintenance.kv_put("a", b"0")
        await maintenance.acquire_lease(name=LEASE, node_id=N1, node_epoch=1, lease_ms=LEASE_MS)
        stream_id = await store.create_stream(node_id=N1, node_epoch=1)
        await store.open_stream(node_id=N1, node_epoch=1, stream_id=stream_id, epoch=0)
        first = await upload(store, N1, [(stream_id, 0, 10)])
        second = await upload(store, N1, [(stream_id, 10, 20)])
        target = await maintenance.prepare_objects(count=2, ttl_ms=TTL_MS)
        await maintenance.commit_stream_set_object(
            sso_request(N1, target, [(stream_id, 0, 20)], compacted=[first, second], node_epoch=1)
        )
        assert [s.object_id for s in await store.get_stream_set_objects(N1)] == [target]
        clock.advance(LEASE_MS)  # the maintenance lease expires: refused before anyone takes it
        with raises(FencedError, ErrorCode.NODE_FENCED):
            await maintenance.kv_put("a", b"expired")
        taken = await store.acquire_lease(name=LEASE, node_id=N2, node_epoch=b.node_epoch, lease_ms=LEASE_MS)
        assert taken.node_id == N2
        before = await snapshot(store)
        late = sso_request(N1, ObjectId(target + 1), [(stream_id, 0, 20)], compacted=[target], node_epoch=1)
        for call in (
            lambda: maintenance.commit_stream_set_object(late),
            lambda: maintenance.mark_destroyed([target], now_ms=clock.now_ms),
            lambda: maintenance.expire_prepared(now_ms=clock.now_ms),
            lambda: maintenance.prepare_objects(count=1, ttl_ms=TTL_MS),
        ):
            with raises(FencedError, ErrorCode.NODE_FENCED):
                await call()
        assert await snapshot(store) == before
        await store.kv_put("a", b"node-bound writes go on")  # the base store needs no lease
        await maintenance.close()  # a view closes nothing
        assert await store.kv_get("a") == b"node-bound writes go on"
        with pytest.raises(InvalidArgumentError):
            maintenance.bind_node(N1, 1)

    # -- create / open / close ----------------------------------------------------------------

    async def test_create_stream_hands_out_ids_and_starts_closed(self, store: MetadataStore) -> None:
        await node(store)
        first = await store.create_stream(node_id=N1, node_epoch=EPOCH, tags={"topic": "t", "partition": "3"})
        second = await store.create_stream(node_id=N1, node_epoch=EPOCH)
        assert (first, second) == (0, 1)
        stream = await store.describe_stream(first)
        assert (stream.epoch, stream.state, stream.start_offset, stream.end_offset) == (
            -1,
            StreamState.CLOSED,
            0,
            0,
        )
        assert stream.ranges == ()
        assert dict(stream.tags) == {"topic": "t", "partition": "3"}
        assert [s.stream_id for s in await store.list_streams()] == [0, 1]

    async def test_create_stream_rejects_bad_tags(self, store: MetadataStore) -> None:
        await node(store)
        for tags in ({"": "x"}, {"k": 3}, {f"k{i}": "v" for i in range(65)}):
            with pytest.raises(InvalidArgumentError):
                await store.create_stream(node_id=N1, node_epoch=EPOCH, tags=tags)  # type: ignore[arg-type]
        assert await store.list_streams() == []

    async def test_first_open_creates_the_first_range(self, store: MetadataStore) -> None:
        await node(store)
        stream_id = await store.create_stream(node_id=N1, node_epoch=EPOCH)
        stream = await store.open_stream(node_id=N1, node_epoch=EPOCH, stream_id=stream_id, epoch=3)
        assert (stream.epoch, stream.state) == (3, StreamState.OPENED)
        assert stream.ranges == (RangeMetadata(stream_id, 3, 0, 0, 0, N1),)
        assert stream == await store.describe_stream(stream_id)

    async def test_open_missing_stream_is_not_found(self, store: MetadataStore) -> None:
        await node(store)
        with raises(NotFoundError, ErrorCode.STREAM_NOT_EXIST):
            await store.open_stream(node_id=N1, node_epoch=EPOCH, stream_id=StreamId(42), epoch=0)
        with raises(NotFoundError, ErrorCode.STREAM_NOT_EXIST):
            await store.describe_stream(StreamId(42))

    async def test_open_with_a_lower_epoch_is_fenced(self, store: MetadataStore) -> None:
        await node(store)
        stream_id = await opened(store, epoch=5)
        with raises(FencedError, ErrorCode.STREAM_FENCED):
            await store.open_stream(node_id=N1, node_epoch=EPOCH, stream_id=stream_id, epoch=4)

    async def test_open_with_a_higher_epoch_while_opened_is_not_closed(self, store: MetadataStore) -> None:
        await node(store, N1, N2)
        stream_id = await opened(store, N1, epoch=0)
        before = await snapshot(store)
        with raises(ConflictError, ErrorCode.STREAM_NOT_CLOSED):
            await store.open_stream(node_id=N1, node_epoch=EPOCH, stream_id=stream_id, epoch=1)
        # another node is told who owns it (the cluster's ownership rule)
        with raises(NotOwnerError, ErrorCode.NOT_OWNER):
            await store.open_stream(node_id=N2, node_epoch=EPOCH, stream_id=stream_id, epoch=1)
        assert await snapshot(store) == before

    async def test_reopen_with_the_same_epoch_is_a_retry(self, store: MetadataStore) -> None:
        await node(store, N1, N2)
        stream_id = await opened(store, epoch=2)
        again = await store.open_stream(node_id=N1, node_epoch=EPOCH, stream_id=stream_id, epoch=2)
        assert again == await store.describe_stream(stream_id)
        await store.close_stream(node_id=N1, node_epoch=EPOCH, stream_id=stream_id, epoch=2)
        reopened = await store.open_stream(node_id=N1, node_epoch=EPOCH, stream_id=stream_id, epoch=2)
        assert reopened.state == StreamState.OPENED
        assert reopened.ranges == again.ranges
        with raises(FencedError, ErrorCode.STREAM_FENCED):
            await store.open_stream(node_id=N2, node_epoch=EPOCH, stream_id=stream_id, epoch=2)

    async def test_open_after_close_seals_the_range_and_starts_a_new_one(self, store: MetadataStore) -> None:
        await node(store, N1, N2)
        stream_id = await opened(store, N1, epoch=0)
        await upload(store, N1, [(stream_id, 0, 100)])
        await store.close_stream(node_id=N1, node_epoch=EPOCH, stream_id=stream_id, epoch=0)
        stream = await store.open_stream(node_id=N2, node_epoch=EPOCH, stream_id=stream_id, epoch=1)
        assert stream.ranges == (
            RangeMetadata(stream_id, 0, 0, 0, 100, N1),
            RangeMetadata(stream_id, 1, 1, 100, 100, N2),
        )
        assert (stream.epoch, stream.end_offset) == (1, 100)
        assert stream == await store.describe_stream(stream_id)

    async def test_open_drops_empty_and_stream_object_covered_ranges(self, store: MetadataStore) -> None:
        await node(store, N1, N2)
        stream_id = await opened(store, N1, epoch=0)
        await store.close_stream(node_id=N1, node_epoch=EPOCH, stream_id=stream_id, epoch=0)
        await store.open_stream(node_id=N2, node_epoch=EPOCH, stream_id=stream_id, epoch=1)
        await upload(store, N2, [], [(stream_id, 0, 50)])
        await store.close_stream(node_id=N2, node_epoch=EPOCH, stream_id=stream_id, epoch=1)
        stream = await store.open_stream(node_id=N1, node_epoch=EPOCH, stream_id=stream_id, epoch=2)
        # range 0 was empty; range 1 ([0, 50)) lies inside the stream objects; only the new range stays
        assert stream.ranges == (RangeMetadata(stream_id, 2, 2, 50, 50, N1),)

    async def test_close_checks_ownership_and_is_idempotent(self, store: MetadataStore) -> None:
        await node(store, N1, N2)
        stream_id = await opened(store, N1, epoch=3)
        with raises(FencedError, ErrorCode.STREAM_FENCED):
            await store.close_stream(node_id=N1, node_epoch=EPOCH, stream_id=stream_id, epoch=2)
        with raises(ConflictError, ErrorCode.STREAM_INNER_ERROR):
            await store.close_stream(node_id=N1, node_epoch=EPOCH, stream_id=stream_id, epoch=4)
        with raises(FencedError, ErrorCode.STREAM_FENCED):
            await store.close_stream(node_id=N2, node_epoch=EPOCH, stream_id=stream_id, epoch=3)
        with raises(NotFoundError, ErrorCode.STREAM_NOT_EXIST):
            await store.close_stream(node_id=N1, node_epoch=EPOCH, stream_id=StreamId(9), epoch=3)
        await store.close_stream(node_id=N1, node_epoch=EPOCH, stream_id=stream_id, epoch=3)
        before = await snapshot(store)
        await store.close_stream(node_id=N1, node_epoch=EPOCH, stream_id=stream_id, epoch=3)
        assert await snapshot(store) == before
        assert (await store.describe_stream(stream_id)).state == StreamState.CLOSED

    async def test_a_never_opened_stream_has_no_owner(self, store: MetadataStore) -> None:
        await node(store)
        stream_id = await store.create_stream(node_id=N1, node_epoch=EPOCH)
        with raises(ConflictError, ErrorCode.STREAM_INNER_ERROR):
            await store.close_stream(node_id=N1, node_epoch=EPOCH, stream_id=stream_id, epoch=0)

    async def test_bad_arguments_are_invalid(self, store: MetadataStore) -> None:
        await node(store)
        stream_id = await opened(store)
        bad_calls = [
            store.open_stream(node_id=N1, node_epoch=EPOCH, stream_id=stream_id, epoch=-1),
            store.open_stream(node_id=NodeId(-1), node_epoch=EPOCH, stream_id=stream_id, epoch=0),
            store.trim_stream(
                node_id=N1, node_epoch=EPOCH, stream_id=stream_id, epoch=0, new_start_offset=-5
            ),
            store.prepare_objects(count=0, ttl_ms=TTL_MS),
            store.prepare_objects(count=1, ttl_ms=0),
            store.get_objects(stream_id=stream_id, start_offset=5, end_offset=5, limit=1),
            store.get_objects(stream_id=stream_id, start_offset=0, end_offset=-1, limit=0),
            store.destroyable_objects(marked_before_ms=0, limit=0),
            store.destroyable_objects(marked_before_ms=-1, limit=1),
            store.list_objects([7]),  # type: ignore[list-item]
            store.register_node(node_id=N1, node_epoch=True),
        ]
        for call in bad_calls:
            with pytest.raises(InvalidArgumentError):
                await call

    # -- trim ---------------------------------------------------------------------------------

    async def test_trim_preconditions(self, store: MetadataStore) -> None:
        await node(store, N1, N2)
        stream_id = await opened(store)
        await upload(store, N1, [(stream_id, 0, 100)])
        await store.trim_stream(
            node_id=N1, node_epoch=EPOCH, stream_id=stream_id, epoch=0, new_start_offset=40
        )
        with raises(ConflictError, ErrorCode.OFFSET_NOT_MATCHED):
            await store.trim_stream(
                node_id=N1, node_epoch=EPOCH, stream_id=stream_id, epoch=0, new_start_offset=39
            )
        before = await snapshot(store)
        await store.trim_stream(
            node_id=N1, node_epoch=EPOCH, stream_id=stream_id, epoch=0, new_start_offset=40
        )
        assert await snapshot(store) == before
        with raises(FencedError, ErrorCode.STREAM_FENCED):
            await store.trim_stream(
                node_id=N2, node_epoch=EPOCH, stream_id=stream_id, epoch=0, new_start_offset=50
            )
        await store.close_stream(node_id=N1, node_epoch=EPOCH, stream_id=stream_id, epoch=0)
        with raises(ConflictError, ErrorCode.STREAM_NOT_OPENED):
            await store.trim_stream(
                node_id=N1, node_epoch=EPOCH, stream_id=stream_id, epoch=0, new_start_offset=50
            )

    async def test_trim_moves_the_start_and_edits_ranges(self, store: MetadataStore) -> None:
        await node(store, N1, N2)
        stream_id = await opened(store, N1, epoch=0)
        await upload(store, N1, [(stream_id, 0, 100)])
        await store.close_stream(node_id=N1, node_epoch=EPOCH, stream_id=stream_id, epoch=0)
        await store.open_stream(node_id=N2, node_epoch=EPOCH, stream_id=stream_id, epoch=1)
        await upload(store, N2, [(stream_id, 100, 150)])
        await store.close_stream(node_id=N2, node_epoch=EPOCH, stream_id=stream_id, epoch=1)
        await store.open_stream(node_id=N1, node_epoch=EPOCH, stream_id=stream_id, epoch=2)
        await upload(store, N1, [(stream_id, 150, 200)])
        await store.trim_stream(
            node_id=N1, node_epoch=EPOCH, stream_id=stream_id, epoch=2, new_start_offset=120
        )
        stream = await store.describe_stream(stream_id)
        assert (stream.start_offset, stream.end_offset) == (120, 200)
        assert stream.ranges == (  # range 0 wholly below the trim is gone, range 1 straddles it
            RangeMetadata(stream_id, 1, 1, 120, 150, N2),
            RangeMetadata(stream_id, 2, 2, 150, 200, N1),
        )
        await store.trim_stream(
            node_id=N1, node_epoch=EPOCH, stream_id=stream_id, epoch=2, new_start_offset=170
        )
        stream = await store.describe_stream(stream_id)
        assert stream.ranges == (RangeMetadata(stream_id, 2, 2, 170, 200, N1),)

    async def test_trim_past_the_end_moves_the_end(self, store: MetadataStore) -> None:
        await node(store)
        stream_id = await opened(store)
        await upload(store, N1, [(stream_id, 0, 10)])
        await store.trim_stream(
            node_id=N1, node_epoch=EPOCH, stream_id=stream_id, epoch=0, new_start_offset=25
        )
        stream = await store.describe_stream(stream_id)
        assert (stream.start_offset, stream.end_offset) == (25, 25)
        assert stream.ranges == (RangeMetadata(stream_id, 0, 0, 25, 25, N1),)
        # an upload that was in flight crosses the trim point: accepted, and the end moves on
        await upload(store, N1, [(stream_id, 10, 30)])
        assert (await store.describe_stream(stream_id)).end_offset == 30

    # -- delete -------------------------------------------------------------------------------

    async def test_delete_stream(self, store: MetadataStore, clock: FakeClock) -> None:
        await node(store)
        await store.delete_stream(stream_id=StreamId(5), epoch=0)  # missing: no-op
        stream_id = await opened(store)
        other = await opened(store)
        sso = await upload(store, N1, [(stream_id, 0, 10), (other, 0, 10)], [(stream_id, 10, 20)])
        with raises(ConflictError, ErrorCode.STREAM_NOT_CLOSED):
            await store.delete_stream(stream_id=stream_id, epoch=0)
        await store.close_stream(node_id=N1, node_epoch=EPOCH, stream_id=stream_id, epoch=0)
        clock.advance(5)
        await store.delete_stream(stream_id=stream_id, epoch=0)
        with raises(NotFoundError, ErrorCode.STREAM_NOT_EXIST):
            await store.describe_stream(stream_id)
        so = await store.get_object(ObjectId(sso + 1))
        assert (so.state, so.marked_at_ms) == (ObjectState.MARK_DESTROYED, clock.now_ms)
        # the stream's data in the StreamSet object stays for compaction to drop
        assert (await store.get_object(sso)).state == ObjectState.COMMITTED
        assert [s.object_id for s in await store.get_stream_set_objects(N1)] == [sso]
        assert (
            await store.get_stream_objects(stream_id=stream_id, start_offset=0, end_offset=-1, limit=10) == []
        )
        assert [s.stream_id for s in await store.list_streams()] == [other]

    # -- prepare and commit StreamSet objects -------------------------------------------------

    async def test_prepare_objects_allocates_consecutive_ids(
        self, store: MetadataStore, clock: FakeClock
    ) -> None:
        first = await store.prepare_objects(count=3, ttl_ms=TTL_MS)
        second = await store.prepare_objects(count=1, ttl_ms=TTL_MS)
        assert (first, second) == (0, 3)
        objects = await store.list_objects()
        assert [o.object_id for o in objects] == [0, 1, 2, 3]
        assert all(o.state == ObjectState.PREPARED and o.kind is None for o in objects)
        assert all(
            o.expires_at_ms == clock.now_ms + TTL_MS and o.prepared_at_ms == clock.now_ms for o in objects
        )

    async def test_next_object_id_reads_the_counter_which_never_goes_down(
        self, store: MetadataStore, clock: FakeClock
    ) -> None:
        assert await store.next_object_id() == 0
        await store.prepare_objects(count=3, ttl_ms=TTL_MS)
        assert await store.next_object_id() == 3
        await store.prepare_objects(count=2, ttl_ms=TTL_MS)
        await store.mark_destroyed([ObjectId(3), ObjectId(4)], now_ms=clock.now_ms)
        await store.remove_objects([ObjectId(3), ObjectId(4)])
        assert [o.object_id for o in await store.list_objects()] == [0, 1, 2]
        assert await store.next_object_id() == 5  # above every id ever issued, not only the known ones
        assert await store.next_object_id() == 5  # a read: it issues nothing
        assert await store.prepare_objects(count=1, ttl_ms=TTL_MS) == 5

    async def test_commit_stream_set_object(self, store: MetadataStore, clock: FakeClock) -> None:
        await node(store)
        a, b = await opened(store), await opened(store)
        first = await store.prepare_objects(count=2, ttl_ms=TTL_MS)
        clock.advance(10)
        request = sso_request(N1, first, [(a, 0, 10), (b, 0, 5)], [(first + 1, a, 10, 30)], size_bytes=777)
        await store.commit_stream_set_object(request)
        sso = await store.get_object(first)
        assert (sso.state, sso.size_bytes, sso.kind, sso.committed_at_ms) == (
            ObjectState.COMMITTED,
            777,
            ObjectKind.STREAM_SET,
            clock.now_ms,
        )
        (listed,) = await store.get_stream_set_objects(N1)
        assert (listed.object_id, listed.node_id, listed.order_id, listed.data_time_ms) == (
            first,
            N1,
            first,
            clock.now_ms,
        )
        assert listed.ranges == request.stream_ranges
        (so,) = await store.get_stream_objects(stream_id=a, start_offset=0, end_offset=-1, limit=10)
        assert (so.object_id, so.start_offset, so.end_offset, so.size_bytes) == (first + 1, 10, 30, 200)
        assert (await store.get_object(ObjectId(first + 1))).kind == ObjectKind.STREAM
        stream_a = await store.describe_stream(a)
        assert stream_a.end_offset == 30
        assert stream_a.ranges[-1].end_offset == 30
        assert (await store.describe_stream(b)).end_offset == 5

    async def test_recommitting_a_committed_object_changes_nothing(
        self, store: MetadataStore, clock: FakeClock
    ) -> None:
        await node(store)
        stream_id = await opened(store)
        first = await store.prepare_objects(count=2, ttl_ms=TTL_MS)
        request = sso_request(N1, first, [(stream_id, 0, 10)], [(first + 1, stream_id, 10, 20)])
        await store.commit_stream_set_object(request)
        before = await snapshot(store)
        clock.advance(1000)
        await store.commit_stream_set_object(request)
        assert await snapshot(store) == before
        # a retry of a stream-object-only commit is a no-op as well
        so_id = await store.prepare_objects(count=1, ttl_ms=TTL_MS)
        so_only = sso_request(N1, NOOP_OBJECT_ID, [], [(so_id, stream_id, 20, 30)])
        await store.commit_stream_set_object(so_only)
        before = await snapshot(store)
        await store.commit_stream_set_object(so_only)
        assert await snapshot(store) == before
        # and so is a retry of a StreamSet-object-only commit (no stream object to notice the retry)
        sso_id = await store.prepare_objects(count=1, ttl_ms=TTL_MS)
        sso_only = sso_request(N1, sso_id, [(stream_id, 30, 40)], [])
        await store.commit_stream_set_object(sso_only)
        before = await snapshot(store)
        await store.commit_stream_set_object(sso_only)
        assert await snapshot(store) == before

    async def test_a_commit_naming_a_committed_stream_object_is_a_no_op(self, store: MetadataStore) -> None:
        await node(store)
        stream_id = await opened(store)
        so_id = await upload(store, N1, [], [(stream_id, 0, 10)]) + 1
        sso = await store.prepare_objects(count=1, ttl_ms=TTL_MS)
        before = await snapshot(store)
        # the StreamSet object is new, but the stream object was committed already: nothing happens
        await store.commit_stream_set_object(
            sso_request(N1, sso, [(stream_id, 10, 20)], [(so_id, stream_id, 0, 10)])
        )
        assert await snapshot(store) == before
        assert (await store.get_object(sso)).state == ObjectState.PREPARED

    async def test_commit_of_an_unprepared_object_is_not_found(
        self, store: MetadataStore, clock: FakeClock
    ) -> None:
        await node(store)
        stream_id = await opened(store)
        with raises(NotFoundError, ErrorCode.OBJECT_NOT_EXIST):
            await store.commit_stream_set_object(sso_request(N1, ObjectId(99), [(stream_id, 0, 10)]))
        object_id = await store.prepare_objects(count=1, ttl_ms=TTL_MS)
        clock.advance(TTL_MS + 1)
        assert await store.expire_prepared(now_ms=clock.now_ms) == [object_id]
        with raises(NotFoundError, ErrorCode.OBJECT_NOT_EXIST):
            await store.commit_stream_set_object(sso_request(N1, object_id, [(stream_id, 0, 10)]))
        # a stream object that was never prepared
        sso = await store.prepare_objects(count=1, ttl_ms=TTL_MS)
        before = await snapshot(store)
        with raises(NotFoundError, ErrorCode.OBJECT_NOT_EXIST):
            await store.commit_stream_set_object(
                sso_request(N1, sso, [(stream_id, 0, 10)], [(500, stream_id, 10, 20)])
            )
        assert await snapshot(store) == before

    async def test_a_failed_continuity_check_writes_nothing(self, store: MetadataStore) -> None:
        await node(store)
        a, b = await opened(store), await opened(store)
        await upload(store, N1, [(a, 0, 10), (b, 0, 10)])
        first = await store.prepare_objects(count=2, ttl_ms=TTL_MS)
        before = await snapshot(store)
        # stream a continues correctly, stream b leaves a gap: the whole commit fails
        request = sso_request(N1, first, [(a, 10, 20), (b, 11, 20)], [(first + 1, a, 20, 30)])
        with raises(ConflictError, ErrorCode.OFFSET_NOT_MATCHED):
            await store.commit_stream_set_object(request)
        assert await snapshot(store) == before
        overlap = sso_request(N1, first, [(a, 5, 20)])
        with raises(ConflictError, ErrorCode.OFFSET_NOT_MATCHED):
            await store.commit_stream_set_object(overlap)
        assert await snapshot(store) == before

    async def test_continuity_needs_an_opened_stream_owned_by_the_committer(
        self, store: MetadataStore
    ) -> None:
        await node(store, N1, N2)
        stream_id = await opened(store, N1)
        object_id = await store.prepare_objects(count=1, ttl_ms=TTL_MS)
        with raises(FencedError, ErrorCode.STREAM_FENCED):
            await store.commit_stream_set_object(sso_request(N2, object_id, [(stream_id, 0, 10)]))
        await store.close_stream(node_id=N1, node_epoch=EPOCH, stream_id=stream_id, epoch=0)
        with raises(ConflictError, ErrorCode.STREAM_NOT_OPENED):
            await store.commit_stream_set_object(sso_request(N1, object_id, [(stream_id, 0, 10)]))
        assert (await store.get_object(object_id)).state == ObjectState.PREPARED

    async def test_one_commit_may_extend_a_stream_twice(self, store: MetadataStore) -> None:
        await node(store)
        stream_id = await opened(store)
        first = await store.prepare_objects(count=2, ttl_ms=TTL_MS)
        await store.commit_stream_set_object(
            sso_request(N1, first, [(stream_id, 0, 10)], [(first + 1, stream_id, 10, 40)])
        )
        assert (await store.describe_stream(stream_id)).end_offset == 40

    async def test_an_upload_advances_only_the_end_of_the_stream_and_its_last_range(
        self, store: MetadataStore
    ) -> None:
        await node(store)
        tags = {"topic": "t", "partition": "7"}
        stream_id = await store.create_stream(node_id=N1, node_epoch=EPOCH, tags=tags)
        await store.open_stream(node_id=N1, node_epoch=EPOCH, stream_id=stream_id, epoch=0)
        await upload(store, N1, [(stream_id, 0, 10)])
        await store.close_stream(node_id=N1, node_epoch=EPOCH, stream_id=stream_id, epoch=0)
        await store.open_stream(node_id=N1, node_epoch=EPOCH, stream_id=stream_id, epoch=1)
        await upload(store, N1, [(stream_id, 10, 25)])
        stream = await store.describe_stream(stream_id)
        assert (stream.epoch, stream.state, stream.start_offset, stream.end_offset) == (
            1, StreamState.OPENED, 0, 25,
        )  # fmt: skip
        assert dict(stream.tags) == tags
        assert [(r.range_index, r.epoch, r.start_offset, r.end_offset) for r in stream.ranges] == [
            (0, 0, 0, 10),
            (1, 1, 10, 25),
        ]

    async def test_fully_trimmed_and_deleted_streams_are_accepted(self, store: MetadataStore) -> None:
        await node(store)
        trimmed, deleted, live = await opened(store), await opened(store), await opened(store)
        await upload(store, N1, [(trimmed, 0, 10)])
        await store.trim_stream(node_id=N1, node_epoch=EPOCH, stream_id=trimmed, epoch=0, new_start_offset=50)
        await store.close_stream(node_id=N1, node_epoch=EPOCH, stream_id=deleted, epoch=0)
        await store.delete_stream(stream_id=deleted, epoch=0)
        first = await store.prepare_objects(count=2, ttl_ms=TTL_MS)
        request = sso_request(
            N1, first, [(trimmed, 10, 20), (deleted, 0, 10), (live, 0, 10)], [(first + 1, deleted, 10, 20)]
        )
        await store.commit_stream_set_object(request)
        assert (await store.describe_stream(trimmed)).end_offset == 50  # below the start: advances nothing
        assert (await store.describe_stream(live)).end_offset == 10
        so = await store.get_object(ObjectId(first + 1))
        assert (so.state, so.kind) == (ObjectState.MARK_DESTROYED, ObjectKind.STREAM)
        (sso,) = [s for s in await store.get_stream_set_objects(N1) if s.object_id == first]
        assert [r.stream_id for r in sso.ranges] == [trimmed, deleted, live]

    async def test_malformed_commit_requests_are_invalid(self, store: MetadataStore) -> None:
        await node(store)
        stream_id = await opened(store)
        first = await store.prepare_objects(count=2, ttl_ms=TTL_MS)
        bad = [
            sso_request(N1, first, [(stream_id, 10, 10)]),
            sso_request(N1, first, [(stream_id, 0, 10), (stream_id, 10, 20)]),
            sso_request(N1, NOOP_OBJECT_ID, [(stream_id, 0, 10)]),
            sso_request(N1, first, [], [(first, stream_id, 0, 10)]),
            sso_request(N1, first, [], [(first + 1, stream_id, 0, 10), (first + 1, stream_id, 10, 20)]),
            sso_request(N1, first, [], compacted=[first + 1, first + 1]),
        ]
        for request in bad:
            with pytest.raises(InvalidArgumentError):
                await store.commit_stream_set_object(request)
        assert all(o.state == ObjectState.PREPARED for o in await store.list_objects())

    # -- compaction commits -------------------------------------------------------------------

    async def test_compaction_commit_replaces_its_sources(
        self, store: MetadataStore, clock: FakeClock
    ) -> None:
        await node(store)
        a, b = await opened(store), await opened(store)
        s1 = await upload(store, N1, [(a, 0, 10), (b, 0, 10)])
        clock.advance(100)
        s2 = await upload(store, N1, [(a, 10, 20)])
        clock.advance(100)
        s3 = await upload(store, N1, [(b, 10, 20)])
        data_time_s1 = (await store.get_stream_set_objects(N1))[0].data_time_ms
        compacted = await store.prepare_objects(count=2, ttl_ms=TTL_MS)
        clock.advance(100)
        # one SSO for stream b, stream a goes to a stream object; no continuity check applies
        request = sso_request(
            N1, compacted, [(b, 0, 20)], [(compacted + 1, a, 0, 20)], compacted=[s1, s2, s3], order_id=-1
        )
        await store.commit_stream_set_object(request)
        (merged,) = await store.get_stream_set_objects(N1)
        assert (merged.object_id, merged.order_id, merged.data_time_ms) == (compacted, s1, data_time_s1)
        for source in (s1, s2, s3):
            obj = await store.get_object(source)
            assert (obj.state, obj.marked_at_ms) == (ObjectState.MARK_DESTROYED, clock.now_ms)
        assert (await store.describe_stream(a)).end_offset == 20
        (split,) = await store.get_stream_objects(stream_id=a, start_offset=0, end_offset=-1, limit=10)
        assert split.data_time_ms == data_time_s1
        assert spans(await store.get_objects(stream_id=a, start_offset=0, end_offset=-1, limit=10)) == [
            (compacted + 1, ObjectKind.STREAM, 0, 20)
        ]

    async def test_compaction_commit_does_not_check_or_advance_offsets(self, store: MetadataStore) -> None:
        await node(store)
        stream_id = await opened(store)
        s1 = await upload(store, N1, [(stream_id, 0, 10)])
        await store.close_stream(node_id=N1, node_epoch=EPOCH, stream_id=stream_id, epoch=0)
        merged = await store.prepare_objects(count=1, ttl_ms=TTL_MS)
        await store.commit_stream_set_object(
            sso_request(N1, merged, [(stream_id, 0, 10)], compacted=[s1], order_id=-1)
        )
        assert (await store.describe_stream(stream_id)).end_offset == 10
        assert [s.object_id for s in await store.get_stream_set_objects(N1)] == [merged]

    async def test_compaction_of_a_missing_object_writes_nothing(self, store: MetadataStore) -> None:
        await node(store)
        stream_id = await opened(store)
        s1 = await upload(store, N1, [(stream_id, 0, 10)])
        s2 = await upload(store, N1, [(stream_id, 10, 20)])
        await store.mark_destroyed([s2], now_ms=START_MS)
        merged = await store.prepare_objects(count=1, ttl_ms=TTL_MS)
        before = await snapshot(store)
        for compacted in ([s1, 999], [s1, s2]):
            with raises(ConflictError, ErrorCode.COMPACTED_OBJECTS_NOT_FOUND):
                await store.commit_stream_set_object(
                    sso_request(N1, merged, [(stream_id, 0, 20)], compacted=compacted, order_id=-1)
                )
            assert await snapshot(store) == before

    async def test_compaction_that_keeps_nothing(self, store: MetadataStore) -> None:
        await node(store)
        stream_id = await opened(store)
        s1 = await upload(store, N1, [(stream_id, 0, 10)])
        await store.commit_stream_set_object(sso_request(N1, NOOP_OBJECT_ID, [], compacted=[s1], order_id=-1))
        assert await store.get_stream_set_objects(N1) == []
        assert (await store.get_object(s1)).state == ObjectState.MARK_DESTROYED

    async def test_replace_commit_requires_a_committed_object(self, store: MetadataStore) -> None:
        await node(store)
        stream_id = await opened(store)
        s1 = await upload(store, N1, [(stream_id, 0, 10)])
        before = await snapshot(store)
        await store.commit_stream_set_object(sso_request(N1, s1, [(stream_id, 0, 10)], compacted=[s1]))
        assert await snapshot(store) == before
        prepared = await store.prepare_objects(count=1, ttl_ms=TTL_MS)
        with raises(ConflictError, ErrorCode.OBJECT_NOT_COMMITTED):
            await store.commit_stream_set_object(
                sso_request(N1, prepared, [(stream_id, 10, 20)], compacted=[prepared])
            )
        with raises(NotFoundError, ErrorCode.OBJECT_NOT_EXIST):
            await store.commit_stream_set_object(
                sso_request(N1, ObjectId(77), [(stream_id, 10, 20)], compacted=[77])
            )

    # -- commit_stream_object -----------------------------------------------------------------

    def _so_request(
        self, object_id: int, stream_id: int, start: int, end: int, sources: Sequence[int], *, epoch: int = 0,
        node_id: NodeId = N1,
    ) -> CommitStreamObjectRequest:  # fmt: skip
        return CommitStreamObjectRequest(
            object_id=ObjectId(object_id),
            object_size_bytes=(end - start) * 10,
            stream_id=StreamId(stream_id),
            stream_epoch=epoch,
            start_offset=start,
            end_offset=end,
            source_object_ids=tuple(ObjectId(s) for s in sources),
            node_id=node_id,
            node_epoch=EPOCH,
        )

    async def test_commit_stream_object_merges_sources(self, store: MetadataStore, clock: FakeClock) -> None:
        await node(store)
        stream_id = await opened(store)
        first = await upload(store, N1, [], [(stream_id, 0, 10)])
        clock.advance(50)
        second = await upload(store, N1, [], [(stream_id, 10, 20)])
        sources = [first + 1, second + 1]
        merged = await store.prepare_objects(count=1, ttl_ms=TTL_MS)
        clock.advance(50)
        await store.commit_stream_object(self._so_request(merged, stream_id, 0, 20, sources))
        (so,) = await store.get_stream_objects(stream_id=stream_id, start_offset=0, end_offset=-1, limit=10)
        assert (so.object_id, so.start_offset, so.end_offset, so.data_time_ms) == (merged, 0, 20, START_MS)
        for source in sources:
            assert (await store.get_object(ObjectId(source))).state == ObjectState.MARK_DESTROYED
        before = await snapshot(store)
        await store.commit_stream_object(self._so_request(merged, stream_id, 0, 20, sources))  # a retry
        assert await snapshot(store) == before

    async def test_commit_stream_object_checks_ownership_unless_epoch_is_minus_one(
        self, store: MetadataStore
    ) -> None:
        await node(store, N1, N2)
        stream_id = await opened(store, N1, epoch=3)
        src = await upload(store, N1, [], [(stream_id, 0, 10)])
        merged = await store.prepare_objects(count=1, ttl_ms=TTL_MS)
        with raises(FencedError, ErrorCode.STREAM_FENCED):
            await store.commit_stream_object(self._so_request(merged, stream_id, 0, 10, [src + 1], epoch=2))
        with raises(FencedError, ErrorCode.STREAM_FENCED):
            await store.commit_stream_object(
                self._so_request(merged, stream_id, 0, 10, [src + 1], epoch=3, node_id=N2)
            )
        await store.commit_stream_object(
            self._so_request(merged, stream_id, 0, 10, [src + 1], epoch=-1, node_id=N2)
        )
        assert (await store.get_object(merged)).state == ObjectState.COMMITTED

    async def test_commit_stream_object_with_a_missing_source_writes_nothing(
        self, store: MetadataStore
    ) -> None:
        await node(store)
        stream_id = await opened(store)
        src = await upload(store, N1, [], [(stream_id, 0, 10)])
        merged = await store.prepare_objects(count=1, ttl_ms=TTL_MS)
        before = await snapshot(store)
        with raises(ConflictError, ErrorCode.COMPACTED_OBJECTS_NOT_FOUND):
            await store.commit_stream_object(self._so_request(merged, stream_id, 0, 10, [src + 1, 404]))
        assert await snapshot(store) == before
        with raises(NotFoundError, ErrorCode.OBJECT_NOT_EXIST):
            await store.commit_stream_object(self._so_request(405, stream_id, 0, 10, [src + 1]))
        assert await snapshot(store) == before

    async def test_commit_stream_object_minus_one_only_destroys(self, store: MetadataStore) -> None:
        await node(store)
        stream_id = await opened(store)
        src = await upload(store, N1, [], [(stream_id, 0, 10)])
        await store.commit_stream_object(self._so_request(-1, stream_id, 0, 0, [src + 1]))
        assert (
            await store.get_stream_objects(stream_id=stream_id, start_offset=0, end_offset=-1, limit=10) == []
        )
        assert (await store.get_object(ObjectId(src + 1))).state == ObjectState.MARK_DESTROYED

    async def test_commit_stream_object_for_a_deleted_stream_is_destroyed(self, store: MetadataStore) -> None:
        await node(store)
        stream_id = await opened(store)
        merged = await store.prepare_objects(count=1, ttl_ms=TTL_MS)
        await store.close_stream(node_id=N1, node_epoch=EPOCH, stream_id=stream_id, epoch=0)
        await store.delete_stream(stream_id=stream_id, epoch=0)
        await store.commit_stream_object(self._so_request(merged, stream_id, 0, 10, [], epoch=-1))
        assert (await store.get_object(merged)).state == ObjectState.MARK_DESTROYED

    async def test_commit_stream_object_raises_the_end_offset(self, store: MetadataStore) -> None:
        await node(store)
        stream_id = await opened(store)
        merged = await store.prepare_objects(count=1, ttl_ms=TTL_MS)
        await store.commit_stream_object(self._so_request(merged, stream_id, 0, 10, []))
        assert (await store.describe_stream(stream_id)).end_offset == 10

    # -- get_objects --------------------------------------------------------------------------

    async def _three_owners(self, store: MetadataStore) -> tuple[StreamId, dict[str, int]]:
        """A stream written by N1 (epoch 0), then N2 (epoch 1), then N1 again (epoch 2), mixing
        StreamSet objects (shared with another stream) and stream objects."""
        await node(store, N1, N2)
        sid = await opened(store, N1)
        other = await opened(store, N1)
        ids: dict[str, int] = {}
        ids["n1a"] = await upload(store, N1, [(sid, 0, 10), (other, 0, 5)])
        ids["n1b"] = await upload(store, N1, [(other, 5, 9)], [(sid, 10, 30)]) + 1
        ids["n1c"] = await upload(store, N1, [(sid, 30, 40)])
        await store.close_stream(node_id=N1, node_epoch=EPOCH, stream_id=sid, epoch=0)
        await store.open_stream(node_id=N2, node_epoch=EPOCH, stream_id=sid, epoch=1)
        ids["n2a"] = await upload(store, N2, [(sid, 40, 55)])
        ids["n2b"] = await upload(store, N2, [(sid, 55, 60)])
        await store.close_stream(node_id=N2, node_epoch=EPOCH, stream_id=sid, epoch=1)
        await store.open_stream(node_id=N1, node_epoch=EPOCH, stream_id=sid, epoch=2)
        ids["n1d"] = await upload(store, N1, [(sid, 60, 70)])
        return sid, ids

    async def test_get_objects_walks_stream_objects_and_every_owner(self, store: MetadataStore) -> None:
        sid, ids = await self._three_owners(store)
        slices = await store.get_objects(stream_id=sid, start_offset=0, end_offset=-1, limit=100)
        assert spans(slices) == [
            (ids["n1a"], ObjectKind.STREAM_SET, 0, 10),
            (ids["n1b"], ObjectKind.STREAM, 10, 30),
            (ids["n1c"], ObjectKind.STREAM_SET, 30, 40),
            (ids["n2a"], ObjectKind.STREAM_SET, 40, 55),
            (ids["n2b"], ObjectKind.STREAM_SET, 55, 60),
            (ids["n1d"], ObjectKind.STREAM_SET, 60, 70),
        ]
        assert slices[0].size_bytes == (await store.get_object(ObjectId(ids["n1a"]))).size_bytes
        assert all(s.stream_id == sid for s in slices)

    async def test_get_objects_starts_in_the_object_holding_start(self, store: MetadataStore) -> None:
        sid, ids = await self._three_owners(store)
        got = await store.get_objects(stream_id=sid, start_offset=45, end_offset=58, limit=100)
        assert spans(got) == [
            (ids["n2a"], ObjectKind.STREAM_SET, 40, 55),
            (ids["n2b"], ObjectKind.STREAM_SET, 55, 60),
        ]
        got = await store.get_objects(stream_id=sid, start_offset=15, end_offset=-1, limit=2)
        assert spans(got) == [
            (ids["n1b"], ObjectKind.STREAM, 10, 30),
            (ids["n1c"], ObjectKind.STREAM_SET, 30, 40),
        ]
        assert await store.get_objects(stream_id=sid, start_offset=70, end_offset=-1, limit=5) == []

    async def test_get_objects_after_compaction_and_trim(self, store: MetadataStore) -> None:
        sid, ids = await self._three_owners(store)
        merged = await store.prepare_objects(count=1, ttl_ms=TTL_MS)
        await store.commit_stream_set_object(
            sso_request(N2, merged, [(sid, 40, 60)], compacted=[ids["n2a"], ids["n2b"]], order_id=-1)
        )
        await store.trim_stream(node_id=N1, node_epoch=EPOCH, stream_id=sid, epoch=2, new_start_offset=35)
        got = await store.get_objects(stream_id=sid, start_offset=35, end_offset=-1, limit=100)
        assert spans(got) == [
            (ids["n1c"], ObjectKind.STREAM_SET, 30, 40),
            (merged, ObjectKind.STREAM_SET, 40, 60),
            (ids["n1d"], ObjectKind.STREAM_SET, 60, 70),
        ]
        with pytest.raises(OffsetOutOfRangeError):
            await store.get_objects(stream_id=sid, start_offset=34, end_offset=-1, limit=100)
        with raises(NotFoundError, ErrorCode.STREAM_NOT_EXIST):
            await store.get_objects(stream_id=StreamId(99), start_offset=0, end_offset=-1, limit=100)

    async def test_get_objects_stops_at_a_gap(self, store: MetadataStore) -> None:
        await node(store)
        sid = await opened(store)
        s1 = await upload(store, N1, [(sid, 0, 10)])
        s2 = await upload(store, N1, [(sid, 10, 20)])
        await store.mark_destroyed([s2], now_ms=START_MS)
        assert spans(await store.get_objects(stream_id=sid, start_offset=0, end_offset=-1, limit=9)) == [
            (s1, ObjectKind.STREAM_SET, 0, 10)
        ]

    async def test_get_objects_scans_stream_set_objects_in_order_id_order(self, store: MetadataStore) -> None:
        await node(store)
        sid = await opened(store)
        first = await upload(store, N1, [(sid, 0, 10)])
        second = await upload(store, N1, [(sid, 10, 20)])
        third = await upload(store, N1, [(sid, 20, 30)])
        # a compaction result placed after `third` in order-id order, holding [10, 20)
        late = await store.prepare_objects(count=1, ttl_ms=TTL_MS)
        await store.commit_stream_set_object(
            sso_request(N1, late, [(sid, 10, 20)], compacted=[second], order_id=third + 100)
        )
        # the scan meets `third` (starting beyond 10) before `late`, and stops there
        got = await store.get_objects(stream_id=sid, start_offset=0, end_offset=-1, limit=10)
        assert spans(got) == [(first, ObjectKind.STREAM_SET, 0, 10)]
        assert await store.get_objects(stream_id=sid, start_offset=12, end_offset=-1, limit=10) == []
        assert late > third

    async def test_get_objects_walks_many_stream_set_objects(self, store: MetadataStore) -> None:
        await node(store, N1, N2)
        sid = await opened(store, N1)
        ids = [await upload(store, N1, [(sid, i * 10, i * 10 + 10)]) for i in range(40)]
        await store.close_stream(node_id=N1, node_epoch=EPOCH, stream_id=sid, epoch=0)
        await store.open_stream(node_id=N2, node_epoch=EPOCH, stream_id=sid, epoch=1)
        ids += [await upload(store, N2, [(sid, 400 + i * 10, 410 + i * 10)]) for i in range(20)]
        got = await store.get_objects(stream_id=sid, start_offset=5, end_offset=-1, limit=1000)
        assert [s.object_id for s in got] == ids
        assert [s.start_offset for s in got] == list(range(0, 600, 10))
        got = await store.get_objects(stream_id=sid, start_offset=123, end_offset=471, limit=1000)
        assert [s.start_offset for s in got] == list(range(120, 480, 10))
        got = await store.get_objects(stream_id=sid, start_offset=0, end_offset=-1, limit=17)
        assert [s.object_id for s in got] == ids[:17]

    async def test_get_objects_skips_overlapping_stream_set_ranges(self, store: MetadataStore) -> None:
        await node(store)
        sid = await opened(store)
        first = await upload(store, N1, [(sid, 0, 10)])

        async def compacted(start: int, end: int, order_id: int) -> ObjectId:
            dummy = ObjectId(await store.prepare_objects(count=2, ttl_ms=TTL_MS))
            object_id = ObjectId(dummy + 1)
            request = sso_request(N1, object_id, [(sid, start, end)], compacted=[dummy], order_id=order_id)
            await store.commit_stream_set_object(request)
            return object_id

        for i in range(40):  # overlapping [5, 15) ranges come first in order-id order: skipped
            await compacted(5, 15, order_id=1000 + i)
        last = await compacted(10, 20, order_id=2000)
        got = await store.get_objects(stream_id=sid, start_offset=0, end_offset=-1, limit=10)
        assert spans(got) == [(first, ObjectKind.STREAM_SET, 0, 10), (last, ObjectKind.STREAM_SET, 10, 20)]

    async def test_get_stream_objects_lists_overlapping_ones(self, store: MetadataStore) -> None:
        await node(store)
        sid = await opened(store)
        ids = [await upload(store, N1, [], [(sid, a, a + 10)]) + 1 for a in range(0, 50, 10)]
        got = await store.get_stream_objects(stream_id=sid, start_offset=15, end_offset=31, limit=10)
        assert [(s.object_id, s.start_offset) for s in got] == [(ids[1], 10), (ids[2], 20), (ids[3], 30)]
        got = await store.get_stream_objects(stream_id=sid, start_offset=15, end_offset=-1, limit=2)
        assert [s.object_id for s in got] == ids[1:3]
        assert (
            await store.get_stream_objects(stream_id=StreamId(9), start_offset=0, end_offset=-1, limit=2)
            == []
        )

    async def test_stream_set_objects_are_listed_per_node_in_order_id_order(
        self, store: MetadataStore
    ) -> None:
        await node(store, N1, N2)
        a = await opened(store, N1)
        b = await opened(store, N2)
        ids = [await upload(store, N1, [(a, i * 10, i * 10 + 10)]) for i in range(3)]
        other = await upload(store, N2, [(b, 0, 10)])
        assert [s.object_id for s in await store.get_stream_set_objects(N1)] == ids
        assert [s.object_id for s in await store.get_stream_set_objects(N2)] == [other]
        assert await store.get_stream_set_objects(N3) == []

    # -- object lifecycle ---------------------------------------------------------------------

    async def test_prepared_objects_expire_after_their_ttl(
        self, store: MetadataStore, clock: FakeClock
    ) -> None:
        first = await store.prepare_objects(count=2, ttl_ms=TTL_MS)
        clock.advance(1000)
        late = await store.prepare_objects(count=1, ttl_ms=TTL_MS)
        deadline = START_MS + TTL_MS
        assert await store.expire_prepared(now_ms=deadline) == []  # due only once the deadline passed
        assert await store.expire_prepared(now_ms=deadline + 1) == [first, first + 1]
        assert await store.expire_prepared(now_ms=deadline + 1) == []
        marked = await store.get_object(first)
        assert (marked.state, marked.marked_at_ms) == (ObjectState.MARK_DESTROYED, deadline + 1)
        assert (await store.get_object(late)).state == ObjectState.PREPARED
        prepared = await store.list_objects([ObjectState.PREPARED])
        assert [o.object_id for o in prepared] == [late]

    async def test_lifecycle_from_prepare_to_removal(self, store: MetadataStore, clock: FakeClock) -> None:
        await node(store)
        sid = await opened(store)
        s1 = await upload(store, N1, [(sid, 0, 10)])
        await store.mark_destroyed([s1], now_ms=clock.now_ms)
        assert await store.get_stream_set_objects(N1) == []
        assert await store.destroyable_objects(marked_before_ms=clock.now_ms, limit=10) == []
        (ready,) = await store.destroyable_objects(marked_before_ms=clock.now_ms + 1, limit=10)
        assert ready.object_id == s1
        await store.remove_objects([s1])
        with raises(NotFoundError, ErrorCode.OBJECT_NOT_EXIST):
            await store.get_object(s1)
        await store.remove_objects([s1])  # already gone: skipped
        assert await store.list_objects() == []

    async def test_destroyable_objects_come_oldest_mark_first(self, store: MetadataStore) -> None:
        first = await store.prepare_objects(count=4, ttl_ms=TTL_MS)
        await store.mark_destroyed([ObjectId(first + 3)], now_ms=10)
        await store.mark_destroyed([ObjectId(first + 1), ObjectId(first + 2)], now_ms=20)
        ready = await store.destroyable_objects(marked_before_ms=100, limit=2)
        assert [o.object_id for o in ready] == [first + 3, first + 1]
        await store.mark_destroyed([ObjectId(first + 3)], now_ms=50)  # already marked: unchanged
        assert (await store.get_object(ObjectId(first + 3))).marked_at_ms == 10

    async def test_mark_and_remove_preconditions(self, store: MetadataStore) -> None:
        first = await store.prepare_objects(count=2, ttl_ms=TTL_MS)
        before = await snapshot(store)
        with raises(NotFoundError, ErrorCode.OBJECT_NOT_EXIST):
            await store.mark_destroyed([first, ObjectId(50)], now_ms=5)
        assert await snapshot(store) == before
        await store.mark_destroyed([first], now_ms=5)
        with pytest.raises(ConflictError):
            await store.remove_objects([first, ObjectId(first + 1)])  # the second one is live
        assert (await store.get_object(first)).state == ObjectState.MARK_DESTROYED

    # -- KV -----------------------------------------------------------------------------------

    async def test_kv_put_get_delete(self, store: MetadataStore) -> None:
        assert await store.kv_get("a") is None
        assert await store.kv_put("a", b"1") == b"1"
        assert await store.kv_put("a", b"2", overwrite=False) == b"1"
        assert await store.kv_get("a") == b"1"
        assert await store.kv_put("a", b"3") == b"3"
        assert await store.kv_put("b", b"", overwrite=False) == b""
        assert await store.kv_get("b") == b""
        assert await store.kv_delete("a") == b"3"
        assert await store.kv_delete("a") is None
        assert await store.kv_get("a") is None

    async def test_kv_rejects_bad_keys_and_values(self, store: MetadataStore) -> None:
        for key, value in (("", b"x"), ("k" * 1025, b"x"), ("k", "text"), ("k", b"x" * ((1 << 20) + 1))):
            with pytest.raises(InvalidArgumentError):
                await store.kv_put(key, value)  # type: ignore[arg-type]
        assert await store.kv_get("k") is None

    async def test_kv_keys_that_are_not_utf8_are_invalid_in_every_call(self, store: MetadataStore) -> None:
        """Regression: SQLite raised a bare UnicodeEncodeError for a lone surrogate; the twin stored it."""
        key = "a\ud800"
        with pytest.raises(InvalidArgumentError, match="UTF-8"):
            await store.kv_put(key, b"x")
        with pytest.raises(InvalidArgumentError, match="UTF-8"):
            await store.kv_get(key)
        with pytest.raises(InvalidArgumentError, match="UTF-8"):
            await store.kv_delete(key)
        assert await store.kv_put("a\x00b", b"x") == b"x"  # any other str is a key

    # -- closing ------------------------------------------------------------------------------

    async def test_a_closed_store_refuses_calls(self, store: MetadataStore) -> None:
        await store.close()
        with pytest.raises(ClosedError):
            await store.list_streams()
        with pytest.raises(ClosedError):
            await store.kv_put("a", b"1")
        await store.close()
