"""The MetadataStore methods, written once over a backend's two primitives: transact and query.

A backend supplies :meth:`TransactionalStore._transact` (run a controller function on a
:class:`~s3stream.metadata.controller.Txn` and apply its changes atomically, or nothing when it
raises) and :meth:`TransactionalStore._query` (run a read-only function on a consistent view).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import TypeVar

from s3stream.clock import Clock
from s3stream.errors import ErrorCode, InvalidArgumentError, NotFoundError
from s3stream.ids import NodeId, ObjectId, StreamId
from s3stream.metadata import (
    batch_ops,
    cluster_ops,
    external_ops,
    node_ops,
    object_ops,
    placement_ops,
    queries,
    stream_ops,
)
from s3stream.metadata import controller as ctl
from s3stream.metadata.base import (
    Assignment,
    CommitObjectsRequest,
    CommitStreamObjectRequest,
    CommitStreamSetObjectRequest,
    KvWrite,
    LeaseInfo,
    NodeInfo,
    NodeRuntime,
    ObjectSlice,
    ObjectState,
    S3ObjectMetadata,
    StreamMetadata,
    StreamObject,
    StreamOutcome,
    StreamSetObject,
    TakeoverInfo,
)
from s3stream.metadata.changes import Counter

T = TypeVar("T")


class TransactionalStore(abc.ABC):
    """Implements :class:`~s3stream.metadata.base.MetadataStore` over ``_transact`` and ``_query``.

    Fencing: after :meth:`bind_node`, every write transaction of this object except the node and
    lease operations (which check their own session) first runs :func:`node_ops.check_guard` inside
    the same transaction, at the store's clock (``_clock_ms``, read when the transaction runs): a
    fenced session writes nothing. Every write method goes through :meth:`_write`; a backend that
    overrides one must keep that.
    """

    def __init__(self, clock_ms: Clock) -> None:
        self._clock_ms = clock_ms
        self._guard: node_ops.Guard | None = None

    @abc.abstractmethod
    async def _transact(self, fn: Callable[[ctl.Txn], T]) -> T: ...

    @abc.abstractmethod
    async def _query(self, fn: Callable[[ctl.StateView], T]) -> T: ...

    @abc.abstractmethod
    async def close(self) -> None: ...

    async def _write(self, fn: Callable[[ctl.Txn], T]) -> T:
        """``_transact`` behind this object's guard, if it is bound."""
        guard = self._guard
        if guard is None:
            return await self._transact(fn)
        clock = self._clock_ms

        def guarded(txn: ctl.Txn) -> T:
            node_ops.check_guard(txn.view, guard, clock())
            return fn(txn)

        return await self._transact(guarded)

    async def _write_now(self, fn: Callable[..., T]) -> T:
        """``_write`` of ``fn(txn, now_ms=...)`` with the store's clock read inside the transaction, so
        a transaction rerun after a conflict (PostgreSQL) or queued behind others stamps its own time."""
        clock = self._clock_ms
        return await self._write(lambda txn: fn(txn, now_ms=clock()))

    # -- fencing ----------------------------------------------------------------------------
    def bind_node(self, node_id: NodeId, node_epoch: int) -> None:
        """Fence this object's writes to the session ``(node_id, node_epoch)``: from now on each
        write transaction first checks that the session is valid (its epoch is the node's current
        one, its lease has not expired), else FencedError(NODE_FENCED) and nothing is written.
        Binding again replaces the session (after ``open_node`` issued a new epoch)."""
        ctl.check_node(node_id, node_epoch)
        self._guard = node_ops.Guard(node_id, node_epoch)

    @property
    def bound_session(self) -> tuple[NodeId, int] | None:
        """The ``(node_id, node_epoch)`` this object's writes are fenced to, if any."""
        guard = self._guard
        return None if guard is None else (guard.node_id, guard.node_epoch)

    def bind_lease(self, name: str) -> TransactionalStore:
        """A view of this store whose writes also require the bound session to hold the lease
        ``name`` (checked in each write transaction): for the jobs that run on the elected node, so a
        node that lost the lease commits nothing. The view shares this store's connection; closing it
        does nothing. The session is the one bound now; bind_node first (else InvalidArgumentError)."""
        node_ops.check_lease_name(name)
        guard = self._guard
        if guard is None:
            raise InvalidArgumentError(
                "bind_lease needs a store bound to a node session: call bind_node first"
            )
        return LeaseBoundStore(self, node_ops.Guard(guard.node_id, guard.node_epoch, name))

    # -- nodes and streams ------------------------------------------------------------------
    async def register_node(self, *, node_id: NodeId, node_epoch: int) -> list[StreamMetadata]:
        clock = self._clock_ms
        return await self._transact(
            lambda txn: stream_ops.register_node(txn, node_id=node_id, node_epoch=node_epoch, now_ms=clock())
        )

    async def open_node(self, *, node_id: NodeId, lease_ms: int, wal_path: str = "") -> NodeInfo:
        clock = self._clock_ms
        return await self._transact(
            lambda txn: node_ops.open_node(
                txn, node_id=node_id, lease_ms=lease_ms, now_ms=clock(), wal_path=wal_path
            )
        )

    async def heartbeat(
        self, *, node_id: NodeId, node_epoch: int, lease_ms: int, wal_pending_bytes: int = -1
    ) -> NodeInfo:
        clock = self._clock_ms
        return await self._transact(
            lambda txn: node_ops.heartbeat(
                txn,
                node_id=node_id,
                node_epoch=node_epoch,
                lease_ms=lease_ms,
                now_ms=clock(),
                wal_pending_bytes=wal_pending_bytes,
            )
        )

    async def close_node(self, *, node_id: NodeId, node_epoch: int) -> None:
        clock = self._clock_ms
        await self._transact(
            lambda txn: node_ops.close_node(txn, node_id=node_id, node_epoch=node_epoch, now_ms=clock())
        )

    async def list_nodes(self) -> list[NodeInfo]:
        return await self._query(lambda view: view.nodes())

    async def acquire_lease(self, *, name: str, node_id: NodeId, node_epoch: int, lease_ms: int) -> LeaseInfo:
        clock = self._clock_ms
        return await self._transact(
            lambda txn: node_ops.acquire_lease(
                txn, name=name, node_id=node_id, node_epoch=node_epoch, lease_ms=lease_ms, now_ms=clock()
            )
        )

    async def release_lease(self, *, name: str, node_id: NodeId, node_epoch: int) -> None:
        await self._transact(
            partial(node_ops.release_lease, name=name, node_id=node_id, node_epoch=node_epoch)
        )

    async def get_lease(self, name: str) -> LeaseInfo | None:
        clock = self._clock_ms
        return await self._query(lambda view: node_ops.get_lease(view, name, now_ms=clock()))

    async def create_stream(
        self, *, node_id: NodeId, node_epoch: int, tags: Mapping[str, str] | None = None
    ) -> StreamId:
        return await self._write(
            partial(stream_ops.create_stream, node_id=node_id, node_epoch=node_epoch, tags=tags)
        )

    async def open_stream(
        self, *, node_id: NodeId, node_epoch: int, stream_id: StreamId, epoch: int
    ) -> StreamMetadata:
        return await self._write_now(
            partial(
                stream_ops.open_stream,
                node_id=node_id,
                node_epoch=node_epoch,
                stream_id=stream_id,
                epoch=epoch,
            )
        )

    async def close_stream(
        self, *, node_id: NodeId, node_epoch: int, stream_id: StreamId, epoch: int
    ) -> None:
        await self._write(
            partial(
                stream_ops.close_stream,
                node_id=node_id,
                node_epoch=node_epoch,
                stream_id=stream_id,
                epoch=epoch,
            )
        )

    async def open_streams(
        self, *, node_id: NodeId, node_epoch: int, requests: Sequence[tuple[StreamId, int]]
    ) -> list[StreamOutcome]:
        pairs = batch_ops.check_requests(requests)
        return await self._write_now(
            partial(batch_ops.open_streams, node_id=node_id, node_epoch=node_epoch, requests=pairs)
        )

    async def close_streams(
        self, *, node_id: NodeId, node_epoch: int, requests: Sequence[tuple[StreamId, int]]
    ) -> list[StreamOutcome]:
        pairs = batch_ops.check_requests(requests)
        return await self._write(
            partial(batch_ops.close_streams, node_id=node_id, node_epoch=node_epoch, requests=pairs)
        )

    async def trim_stream(
        self, *, node_id: NodeId, node_epoch: int, stream_id: StreamId, epoch: int, new_start_offset: int
    ) -> None:
        await self._write(
            partial(
                stream_ops.trim_stream,
                node_id=node_id,
                node_epoch=node_epoch,
                stream_id=stream_id,
                epoch=epoch,
                new_start_offset=new_start_offset,
            )
        )

    async def delete_stream(self, *, stream_id: StreamId, epoch: int) -> None:
        await self._write_now(partial(stream_ops.delete_stream, stream_id=stream_id, epoch=epoch))

    async def describe_stream(self, stream_id: StreamId) -> StreamMetadata:
        stream = await self._query(lambda view: view.stream(stream_id))
        if stream is None:
            raise NotFoundError(f"stream {stream_id} does not exist", code=ErrorCode.STREAM_NOT_EXIST)
        return stream

    async def list_streams(self) -> list[StreamMetadata]:
        return await self._query(lambda view: view.streams())

    # -- objects ----------------------------------------------------------------------------
    async def prepare_objects(self, *, count: int, ttl_ms: int) -> ObjectId:
        return await self._write_now(partial(object_ops.prepare_objects, count=count, ttl_ms=ttl_ms))

    async def next_object_id(self) -> ObjectId:
        return await self._query(lambda view: ObjectId(view.next_id(Counter.OBJECT_ID)))

    async def commit_stream_set_object(self, request: CommitStreamSetObjectRequest) -> None:
        await self._write_now(partial(object_ops.commit_stream_set_object, req=request))

    async def commit_stream_object(self, request: CommitStreamObjectRequest) -> None:
        await self._write_now(partial(object_ops.commit_stream_object, req=request))

    async def commit_objects(self, request: CommitObjectsRequest) -> None:
        await self._write_now(partial(external_ops.commit_objects, req=request))

    async def get_objects(
        self, *, stream_id: StreamId, start_offset: int, end_offset: int, limit: int
    ) -> list[ObjectSlice]:
        return await self._query(
            partial(
                queries.get_objects,
                stream_id=stream_id,
                start_offset=start_offset,
                end_offset=end_offset,
                limit=limit,
            )
        )

    async def get_stream_set_objects(self, node_id: NodeId) -> list[StreamSetObject]:
        return await self._query(lambda view: view.stream_set_objects(node_id))

    async def get_stream_objects(
        self, *, stream_id: StreamId, start_offset: int, end_offset: int, limit: int
    ) -> list[StreamObject]:
        return await self._query(
            partial(
                queries.get_stream_objects,
                stream_id=stream_id,
                start_offset=start_offset,
                end_offset=end_offset,
                limit=limit,
            )
        )

    async def get_object(self, object_id: ObjectId) -> S3ObjectMetadata:
        obj = await self._query(lambda view: view.object(object_id))
        if obj is None:
            raise NotFoundError(f"object {object_id} does not exist", code=ErrorCode.OBJECT_NOT_EXIST)
        return obj

    async def list_objects(self, states: Sequence[ObjectState] | None = None) -> list[S3ObjectMetadata]:
        try:
            wanted = None if states is None else frozenset(ObjectState(s) for s in states)
        except ValueError:
            raise InvalidArgumentError(f"unknown object state in {list(states or ())!r}") from None
        return await self._query(lambda view: view.objects(wanted))

    async def expire_prepared(self, *, now_ms: int) -> list[ObjectId]:
        return await self._write(partial(object_ops.expire_prepared, now_ms=now_ms))

    async def mark_destroyed(self, object_ids: Sequence[ObjectId], *, now_ms: int) -> None:
        await self._write(partial(object_ops.mark_destroyed, object_ids=tuple(object_ids), now_ms=now_ms))

    async def destroyable_objects(self, *, marked_before_ms: int, limit: int) -> list[S3ObjectMetadata]:
        ctl.check_int("marked_before_ms", marked_before_ms, low=0)
        ctl.check_int("limit", limit, low=1, high=ctl.GET_LIMIT_MAX)
        return await self._query(lambda view: view.destroyable(marked_before_ms, limit))

    async def remove_objects(self, object_ids: Sequence[ObjectId]) -> None:
        await self._write(partial(object_ops.remove_objects, object_ids=tuple(object_ids)))

    # -- KV ---------------------------------------------------------------------------------
    async def kv_put(self, key: str, value: bytes, *, overwrite: bool = True) -> bytes:
        return await self._write(partial(stream_ops.kv_put, key=key, value=value, overwrite=overwrite))

    async def kv_get(self, key: str) -> bytes | None:
        return await self._query(partial(stream_ops.kv_get, key=key))

    async def kv_delete(self, key: str) -> bytes | None:
        return await self._write(partial(stream_ops.kv_delete, key=key))

    async def kv_apply(
        self, writes: Sequence[KvWrite], *, node_id: NodeId, wal_offset: int
    ) -> list[bytes | None]:
        return await self._write(
            partial(stream_ops.kv_apply, writes=tuple(writes), node_id=node_id, wal_offset=wal_offset)
        )

    async def kv_applied_offset(self, node_id: NodeId) -> int:
        return await self._query(partial(stream_ops.kv_applied_offset, node_id=node_id))

    # -- cluster: node runtime, assignments, takeovers --------------------------------------
    async def list_node_runtime(self) -> list[NodeRuntime]:
        return await self._query(lambda view: view.node_runtimes())

    async def request_reassign(
        self, *, stream_ids: Sequence[StreamId], to_node_id: NodeId
    ) -> list[Assignment]:
        """Unguarded (see the protocol): any process may request, a bound one too."""
        clock = self._clock_ms
        ids = tuple(stream_ids)
        return await self._transact(
            lambda txn: cluster_ops.request_reassign(
                txn, stream_ids=ids, to_node_id=to_node_id, now_ms=clock()
            )
        )

    async def list_assignments(self) -> list[Assignment]:
        return await self._query(lambda view: view.assignments())

    async def start_takeover(
        self, *, node_id: NodeId, node_epoch: int, taker_node_id: int, taker_node_epoch: int
    ) -> TakeoverInfo:
        return await self._write_now(
            partial(
                cluster_ops.start_takeover,
                node_id=node_id,
                node_epoch=node_epoch,
                taker_node_id=taker_node_id,
                taker_node_epoch=taker_node_epoch,
            )
        )

    async def reassign_takeover(
        self, *, node_id: NodeId, taker_node_id: NodeId, taker_node_epoch: int
    ) -> TakeoverInfo:
        return await self._write_now(
            partial(
                cluster_ops.reassign_takeover,
                node_id=node_id,
                taker_node_id=taker_node_id,
                taker_node_epoch=taker_node_epoch,
            )
        )

    async def list_takeovers(self) -> list[TakeoverInfo]:
        return await self._query(lambda view: view.takeovers())

    async def takeover_streams(
        self, *, node_id: NodeId, taker_node_id: NodeId, taker_node_epoch: int
    ) -> list[tuple[StreamMetadata, int]]:
        return await self._write_now(
            partial(
                cluster_ops.takeover_streams,
                node_id=node_id,
                taker_node_id=taker_node_id,
                taker_node_epoch=taker_node_epoch,
            )
        )

    async def finish_takeover(
        self, *, node_id: NodeId, taker_node_id: NodeId, taker_node_epoch: int, wal_end_offset: int
    ) -> TakeoverInfo:
        return await self._write_now(
            partial(
                cluster_ops.finish_takeover,
                node_id=node_id,
                taker_node_id=taker_node_id,
                taker_node_epoch=taker_node_epoch,
                wal_end_offset=wal_end_offset,
            )
        )

    # -- assignments that cannot finish (decision 0046) -------------------------------------------
    async def settle_assignment(self, *, stream_id: StreamId, node_id: NodeId, node_epoch: int) -> bool:
        return await self._write_now(
            partial(
                cluster_ops.settle_assignment, stream_id=stream_id, node_id=node_id, node_epoch=node_epoch
            )
        )

    async def redirect_assignments(
        self, *, stream_ids: Sequence[StreamId], to_node_id: NodeId
    ) -> list[Assignment]:
        ids = tuple(stream_ids)
        return await self._write_now(
            partial(cluster_ops.redirect_assignments, stream_ids=ids, to_node_id=to_node_id)
        )

    # -- takeover attempts that fail (decision 0045) -----------------------------------------------
    async def report_takeover_progress(
        self, *, node_id: NodeId, taker_node_id: NodeId, taker_node_epoch: int
    ) -> TakeoverInfo:
        return await self._write_now(
            partial(
                cluster_ops.report_takeover_progress,
                node_id=node_id,
                taker_node_id=taker_node_id,
                taker_node_epoch=taker_node_epoch,
            )
        )

    async def give_back_takeover(
        self, *, node_id: NodeId, taker_node_id: NodeId, taker_node_epoch: int
    ) -> TakeoverInfo:
        return await self._write_now(
            partial(
                cluster_ops.give_back_takeover,
                node_id=node_id,
                taker_node_id=taker_node_id,
                taker_node_epoch=taker_node_epoch,
            )
        )

    async def fail_takeover(self, *, node_id: NodeId) -> TakeoverInfo:
        return await self._write_now(partial(cluster_ops.fail_takeover, node_id=node_id))

    # -- object placement over several buckets -----------------------------------------------------
    async def record_placement(self, object_id: ObjectId, bucket_ids: Sequence[int]) -> None:
        ids = placement_ops.check_bucket_ids(bucket_ids)
        await self._write(partial(placement_ops.record_placement, object_id=object_id, bucket_ids=ids))

    async def placements(self, object_ids: Sequence[ObjectId]) -> dict[ObjectId, tuple[int, ...]]:
        ids = placement_ops.check_object_ids(object_ids)
        if not ids:
            return {}
        return await self._query(lambda view: view.placements(ids))

    async def bucket_usage(self, *, unplaced_bucket_id: int = 0) -> dict[int, tuple[int, int]]:
        ctl.check_int("unplaced_bucket_id", unplaced_bucket_id, low=0, high=placement_ops.BUCKET_ID_MAX)
        return await self._query(lambda view: view.bucket_usage(unplaced_bucket_id))

    def now_ms(self) -> int:
        """The store's clock (a PostgreSQL store's is the server's): what leases are judged by."""
        return self._clock_ms()


class LeaseBoundStore(TransactionalStore):
    """A store's view whose write transactions require a session holding a named lease
    (:meth:`TransactionalStore.bind_lease`); reads and the node and lease operations pass through."""

    def __init__(self, base: TransactionalStore, guard: node_ops.Guard) -> None:
        assert guard.lease_name is not None
        super().__init__(base._clock_ms)
        self._base = base
        self._guard = guard
        self.lease_name: str = guard.lease_name
        """The lease every write transaction of this view requires."""

    async def _transact(self, fn: Callable[[ctl.Txn], T]) -> T:
        return await self._base._transact(fn)

    async def _query(self, fn: Callable[[ctl.StateView], T]) -> T:
        return await self._base._query(fn)

    def bind_node(self, node_id: NodeId, node_epoch: int) -> None:
        raise InvalidArgumentError(
            "a lease-bound view keeps its session: bind the base store and bind_lease again"
        )

    async def close(self) -> None:
        """The base store owns the connection: nothing to close."""
