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
from s3stream.metadata import controller as ctl
from s3stream.metadata import object_ops, queries, stream_ops
from s3stream.metadata.base import (
    CommitStreamObjectRequest,
    CommitStreamSetObjectRequest,
    KvWrite,
    ObjectSlice,
    ObjectState,
    S3ObjectMetadata,
    StreamMetadata,
    StreamObject,
    StreamSetObject,
)

T = TypeVar("T")


class TransactionalStore(abc.ABC):
    """Implements :class:`~s3stream.metadata.base.MetadataStore` over ``_transact`` and ``_query``."""

    def __init__(self, clock_ms: Clock) -> None:
        self._clock_ms = clock_ms

    @abc.abstractmethod
    async def _transact(self, fn: Callable[[ctl.Txn], T]) -> T: ...

    @abc.abstractmethod
    async def _query(self, fn: Callable[[ctl.StateView], T]) -> T: ...

    # -- nodes and streams ------------------------------------------------------------------
    async def register_node(self, *, node_id: NodeId, node_epoch: int) -> list[StreamMetadata]:
        return await self._transact(partial(stream_ops.register_node, node_id=node_id, node_epoch=node_epoch))

    async def create_stream(
        self, *, node_id: NodeId, node_epoch: int, tags: Mapping[str, str] | None = None
    ) -> StreamId:
        return await self._transact(
            partial(stream_ops.create_stream, node_id=node_id, node_epoch=node_epoch, tags=tags)
        )

    async def open_stream(
        self, *, node_id: NodeId, node_epoch: int, stream_id: StreamId, epoch: int
    ) -> StreamMetadata:
        return await self._transact(
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
        await self._transact(
            partial(
                stream_ops.close_stream,
                node_id=node_id,
                node_epoch=node_epoch,
                stream_id=stream_id,
                epoch=epoch,
            )
        )

    async def trim_stream(
        self, *, node_id: NodeId, node_epoch: int, stream_id: StreamId, epoch: int, new_start_offset: int
    ) -> None:
        await self._transact(
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
        now_ms = self._clock_ms()
        await self._transact(
            partial(stream_ops.delete_stream, stream_id=stream_id, epoch=epoch, now_ms=now_ms)
        )

    async def describe_stream(self, stream_id: StreamId) -> StreamMetadata:
        stream = await self._query(lambda view: view.stream(stream_id))
        if stream is None:
            raise NotFoundError(f"stream {stream_id} does not exist", code=ErrorCode.STREAM_NOT_EXIST)
        return stream

    async def list_streams(self) -> list[StreamMetadata]:
        return await self._query(lambda view: view.streams())

    # -- objects ----------------------------------------------------------------------------
    async def prepare_objects(self, *, count: int, ttl_ms: int) -> ObjectId:
        now_ms = self._clock_ms()
        return await self._transact(
            partial(object_ops.prepare_objects, count=count, ttl_ms=ttl_ms, now_ms=now_ms)
        )

    async def commit_stream_set_object(self, request: CommitStreamSetObjectRequest) -> None:
        now_ms = self._clock_ms()
        await self._transact(partial(object_ops.commit_stream_set_object, req=request, now_ms=now_ms))

    async def commit_stream_object(self, request: CommitStreamObjectRequest) -> None:
        now_ms = self._clock_ms()
        await self._transact(partial(object_ops.commit_stream_object, req=request, now_ms=now_ms))

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
        return await self._transact(partial(object_ops.expire_prepared, now_ms=now_ms))

    async def mark_destroyed(self, object_ids: Sequence[ObjectId], *, now_ms: int) -> None:
        await self._transact(partial(object_ops.mark_destroyed, object_ids=tuple(object_ids), now_ms=now_ms))

    async def destroyable_objects(self, *, marked_before_ms: int, limit: int) -> list[S3ObjectMetadata]:
        ctl.check_int("marked_before_ms", marked_before_ms, low=0)
        ctl.check_int("limit", limit, low=1, high=ctl.GET_LIMIT_MAX)
        return await self._query(lambda view: view.destroyable(marked_before_ms, limit))

    async def remove_objects(self, object_ids: Sequence[ObjectId]) -> None:
        await self._transact(partial(object_ops.remove_objects, object_ids=tuple(object_ids)))

    # -- KV ---------------------------------------------------------------------------------
    async def kv_put(self, key: str, value: bytes, *, overwrite: bool = True) -> bytes:
        return await self._transact(partial(stream_ops.kv_put, key=key, value=value, overwrite=overwrite))

    async def kv_get(self, key: str) -> bytes | None:
        return await self._query(partial(stream_ops.kv_get, key=key))

    async def kv_delete(self, key: str) -> bytes | None:
        return await self._transact(partial(stream_ops.kv_delete, key=key))

    async def kv_apply(
        self, writes: Sequence[KvWrite], *, node_id: NodeId, wal_offset: int
    ) -> list[bytes | None]:
        return await self._transact(
            partial(stream_ops.kv_apply, writes=tuple(writes), node_id=node_id, wal_offset=wal_offset)
        )

    async def kv_applied_offset(self, node_id: NodeId) -> int:
        return await self._query(partial(stream_ops.kv_applied_offset, node_id=node_id))
