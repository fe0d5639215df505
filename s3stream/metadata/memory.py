"""The in-memory MetadataStore: the SQLite store's twin, sharing its controller, for tests and tools.

Operations run on the event loop without awaiting in between, so each is atomic: the controller
decides against the current state, then the changes are applied in one step. Nothing is persisted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TypeVar

from sortedcontainers import SortedList

from s3stream.clock import Clock, wall_clock_ms
from s3stream.errors import ClosedError
from s3stream.ids import NodeId, ObjectId, StreamId
from s3stream.metadata import controller as ctl
from s3stream.metadata.base import (
    Assignment,
    LeaseInfo,
    NodeInfo,
    NodeRuntime,
    ObjectState,
    RangeMetadata,
    S3ObjectMetadata,
    StreamMetadata,
    StreamObject,
    StreamSetObject,
    StreamState,
    TakeoverInfo,
)
from s3stream.metadata.changes import (
    AdvanceEndOffsets,
    Change,
    Counter,
    PutAssignment,
    PutKv,
    PutLease,
    PutNode,
    PutNodeRuntime,
    PutObject,
    PutPlacement,
    PutRange,
    PutStream,
    PutStreamObject,
    PutStreamSetObject,
    PutTakeover,
    RemoveAssignment,
    RemoveKv,
    RemoveLease,
    RemoveObject,
    RemovePlacements,
    RemoveRange,
    RemoveStream,
    RemoveStreamObject,
    RemoveStreamSetObject,
    SetCounter,
)
from s3stream.metadata.store import TransactionalStore

T = TypeVar("T")


class _State:
    """The whole metadata state as dicts plus sorted indexes; implements the controller's StateView."""

    def __init__(self) -> None:
        self.counters: dict[Counter, int] = {}
        self.node_rows: dict[NodeId, NodeInfo] = {}
        self.lease_rows: dict[str, LeaseInfo] = {}
        self.stream_rows: dict[StreamId, PutStream] = {}
        self.ranges: dict[StreamId, dict[int, RangeMetadata]] = {}
        self.object_rows: dict[ObjectId, S3ObjectMetadata] = {}
        self.prepared: SortedList = SortedList()  # (expires_at_ms, object_id)
        self.destroyed: SortedList = SortedList()  # (marked_at_ms, object_id)
        self.ssos: dict[ObjectId, StreamSetObject] = {}
        self.node_ssos: dict[NodeId, SortedList] = {}  # (order_id, object_id)
        self.node_stream_ssos: dict[tuple[NodeId, StreamId], SortedList] = {}  # (order_id, object_id, range)
        self.sos: dict[ObjectId, StreamObject] = {}
        self.stream_sos: dict[StreamId, SortedList] = {}  # (start_offset, object_id)
        self.kvs: dict[str, bytes] = {}
        self.runtime_rows: dict[NodeId, NodeRuntime] = {}
        self.assignment_rows: dict[StreamId, Assignment] = {}
        self.takeover_rows: dict[NodeId, TakeoverInfo] = {}
        self.placement_rows: dict[ObjectId, set[int]] = {}

    # -- StateView ----------------------------------------------------------------------------
    def node_epoch(self, node_id: NodeId) -> int | None:
        info = self.node_rows.get(node_id)
        return None if info is None else info.node_epoch

    def node(self, node_id: NodeId) -> NodeInfo | None:
        return self.node_rows.get(node_id)

    def nodes(self) -> list[NodeInfo]:
        return [self.node_rows[node_id] for node_id in sorted(self.node_rows)]

    def lease(self, name: str) -> LeaseInfo | None:
        return self.lease_rows.get(name)

    def leases(self) -> list[LeaseInfo]:
        return [self.lease_rows[name] for name in sorted(self.lease_rows)]

    def stream(self, stream_id: StreamId) -> StreamMetadata | None:
        row = self.stream_rows.get(stream_id)
        if row is None:
            return None
        ranges = self.ranges.get(stream_id, {})
        return StreamMetadata(
            stream_id=row.stream_id,
            epoch=row.epoch,
            state=row.state,
            start_offset=row.start_offset,
            end_offset=row.end_offset,
            ranges=tuple(ranges[i] for i in sorted(ranges)),
            tags=dict(row.tags),
        )

    def stream_heads(self, stream_ids: Sequence[StreamId]) -> dict[StreamId, ctl.StreamHead]:
        found: dict[StreamId, ctl.StreamHead] = {}
        for stream_id in stream_ids:
            row = self.stream_rows.get(stream_id)
            if row is None:
                continue
            ranges = self.ranges.get(stream_id)
            last = ranges[max(ranges)] if ranges else None
            found[stream_id] = ctl.StreamHead(
                int(row.state), row.start_offset, row.end_offset,
                -1 if last is None else last.range_index, -1 if last is None else last.node_id,
            )  # fmt: skip
        return found

    def all_continue_at_end(self, node_id: NodeId, spans: Sequence[tuple[StreamId, int, int]]) -> bool:
        opened = StreamState.OPENED
        for stream_id, start, _ in spans:
            row = self.stream_rows.get(stream_id)
            ranges = self.ranges.get(stream_id) if row is not None else None
            if (
                row is None
                or not ranges
                or row.state != opened
                or not row.start_offset < row.end_offset == start
            ):
                return False
            if ranges[max(ranges)].node_id != node_id:
                return False
        return True

    def _described(self, stream_ids: list[StreamId]) -> list[StreamMetadata]:
        out = []
        for stream_id in sorted(stream_ids):
            stream = self.stream(stream_id)
            assert stream is not None
            out.append(stream)
        return out

    def opened_streams(self) -> list[StreamMetadata]:
        return self._described([s for s, row in self.stream_rows.items() if row.state == StreamState.OPENED])

    def streams(self) -> list[StreamMetadata]:
        return self._described(list(self.stream_rows))

    def object(self, object_id: ObjectId) -> S3ObjectMetadata | None:
        return self.object_rows.get(object_id)

    def objects(self, states: frozenset[ObjectState] | None) -> list[S3ObjectMetadata]:
        return [
            self.object_rows[i]
            for i in sorted(self.object_rows)
            if states is None or self.object_rows[i].state in states
        ]

    def stream_set_object(self, object_id: ObjectId) -> StreamSetObject | None:
        return self.ssos.get(object_id)

    def stream_set_objects(self, node_id: NodeId) -> list[StreamSetObject]:
        return [self.ssos[object_id] for _, object_id in self.node_ssos.get(node_id, ())]

    def stream_object(self, object_id: ObjectId) -> StreamObject | None:
        return self.sos.get(object_id)

    def stream_objects_from(self, stream_id: StreamId, offset: int, limit: int) -> list[StreamObject]:
        out: list[StreamObject] = []
        for _, object_id in self.stream_sos.get(stream_id, ()):
            so = self.sos[object_id]
            if so.end_offset > offset:
                out.append(so)
                if len(out) >= limit:
                    break
        return out

    def stream_set_ranges_from(
        self, node_id: NodeId, stream_id: StreamId, offset: int, *, after: tuple[int, int] | None, limit: int
    ) -> list[ctl.StreamSetRange]:
        out: list[ctl.StreamSetRange] = []
        for order_id, object_id, r in self.node_stream_ssos.get((node_id, stream_id), ()):
            if r.end_offset <= offset or (after is not None and (order_id, object_id) <= after):
                continue
            out.append(ctl.StreamSetRange(object_id, order_id, self.ssos[object_id].size_bytes, r))
            if len(out) >= limit:
                break
        return out

    def expired_prepared(self, now_ms: int) -> list[S3ObjectMetadata]:
        expired = self.prepared.irange(maximum=(now_ms - 1, 1 << 63))
        return sorted((self.object_rows[object_id] for _, object_id in expired), key=lambda o: o.object_id)

    def destroyable(self, marked_before_ms: int, limit: int) -> list[S3ObjectMetadata]:
        out = []
        for _, object_id in self.destroyed.irange(maximum=(marked_before_ms - 1, 1 << 63)):
            out.append(self.object_rows[object_id])
            if len(out) >= limit:
                break
        return out

    def next_id(self, counter: Counter) -> int:
        return self.counters.get(counter, 0)

    def kv(self, key: str) -> bytes | None:
        return self.kvs.get(key)

    def node_runtime(self, node_id: NodeId) -> NodeRuntime | None:
        return self.runtime_rows.get(node_id)

    def node_runtimes(self) -> list[NodeRuntime]:
        return [self.runtime_rows[k] for k in sorted(self.runtime_rows)]

    def assignment(self, stream_id: StreamId) -> Assignment | None:
        return self.assignment_rows.get(stream_id)

    def assignments(self) -> list[Assignment]:
        return [self.assignment_rows[k] for k in sorted(self.assignment_rows)]

    def takeover(self, node_id: NodeId) -> TakeoverInfo | None:
        return self.takeover_rows.get(node_id)

    def takeovers(self) -> list[TakeoverInfo]:
        return [self.takeover_rows[k] for k in sorted(self.takeover_rows)]

    # -- applying changes -----------------------------------------------------------------------
    def apply(self, changes: list[Change]) -> None:
        for change in changes:
            self._apply_one(change)

    def _apply_one(self, change: Change) -> None:
        match change:
            case SetCounter(counter, next_value):
                self.counters[counter] = next_value
            case PutNode(node_id, node_epoch, lease_expires_at_ms, heartbeat_at_ms, registered_at_ms):
                self.node_rows[node_id] = NodeInfo(
                    node_id, node_epoch, lease_expires_at_ms, heartbeat_at_ms, registered_at_ms
                )
            case PutLease(lease):
                self.lease_rows[lease.name] = lease
            case RemoveLease(name):
                self.lease_rows.pop(name, None)
            case PutStream():
                self.stream_rows[change.stream_id] = PutStream(
                    change.stream_id, change.epoch, change.state, change.start_offset, change.end_offset,
                    dict(change.tags),
                )  # fmt: skip
                self.ranges.setdefault(change.stream_id, {})
            case RemoveStream(stream_id):
                self.stream_rows.pop(stream_id, None)
                self.ranges.pop(stream_id, None)
                for _, object_id in self.stream_sos.pop(stream_id, ()):
                    self.sos.pop(object_id, None)
            case PutRange(rng):
                self.ranges.setdefault(rng.stream_id, {})[rng.range_index] = rng
            case AdvanceEndOffsets(stream_ids, end_offsets):
                for stream_id, end_offset in zip(stream_ids, end_offsets, strict=True):
                    self.stream_rows[stream_id] = dataclasses.replace(
                        self.stream_rows[stream_id], end_offset=end_offset
                    )
                    ranges = self.ranges[stream_id]
                    last = max(ranges)
                    ranges[last] = dataclasses.replace(ranges[last], end_offset=end_offset)
            case RemoveRange(stream_id, range_index):
                self.ranges.get(stream_id, {}).pop(range_index, None)
            case PutObject(obj):
                self._unindex_object(obj.object_id)
                self.object_rows[obj.object_id] = obj
                if obj.state == ObjectState.PREPARED:
                    self.prepared.add((obj.expires_at_ms, obj.object_id))
                elif obj.state == ObjectState.MARK_DESTROYED:
                    self.destroyed.add((obj.marked_at_ms, obj.object_id))
            case RemoveObject(object_id):
                self._unindex_object(object_id)
                self.object_rows.pop(object_id, None)
            case PutStreamSetObject(sso):
                self._remove_sso(sso.object_id)
                self.ssos[sso.object_id] = sso
                self.node_ssos.setdefault(sso.node_id, SortedList()).add((sso.order_id, sso.object_id))
                for r in sso.ranges:
                    key = (sso.node_id, r.stream_id)
                    self.node_stream_ssos.setdefault(key, SortedList()).add((sso.order_id, sso.object_id, r))
            case RemoveStreamSetObject(object_id):
                self._remove_sso(object_id)
            case PutStreamObject(so):
                self._remove_so(so.object_id)
                self.sos[so.object_id] = so
                self.stream_sos.setdefault(so.stream_id, SortedList()).add((so.start_offset, so.object_id))
            case RemoveStreamObject(object_id):
                self._remove_so(object_id)
            case PutKv(key, value):
                self.kvs[key] = value
            case RemoveKv(key):
                self.kvs.pop(key, None)
            case PutNodeRuntime(runtime):
                self.runtime_rows[runtime.node_id] = runtime
            case PutAssignment(assignment):
                self.assignment_rows[assignment.stream_id] = assignment
            case RemoveAssignment(stream_id):
                self.assignment_rows.pop(stream_id, None)
            case PutTakeover(takeover):
                self.takeover_rows[takeover.node_id] = takeover
            case PutPlacement(object_id, bucket_id):
                self.placement_rows.setdefault(object_id, set()).add(bucket_id)
            case RemovePlacements(object_id):
                self.placement_rows.pop(object_id, None)

    def placements(self, object_ids: Sequence[ObjectId]) -> dict[ObjectId, tuple[int, ...]]:
        rows = self.placement_rows
        return {o: tuple(sorted(rows[o])) for o in object_ids if rows.get(o)}

    def bucket_usage(self, unplaced_bucket_id: int) -> dict[int, tuple[int, int]]:
        usage: dict[int, tuple[int, int]] = {}
        for obj in self.object_rows.values():
            if obj.state != ObjectState.COMMITTED:
                continue
            for bucket_id in self.placement_rows.get(obj.object_id) or (unplaced_bucket_id,):
                count, size = usage.get(bucket_id, (0, 0))
                usage[bucket_id] = (count + 1, size + obj.size_bytes)
        return usage

    def _unindex_object(self, object_id: ObjectId) -> None:
        old = self.object_rows.get(object_id)
        if old is None:
            return
        if old.state == ObjectState.PREPARED:
            self.prepared.discard((old.expires_at_ms, object_id))
        elif old.state == ObjectState.MARK_DESTROYED:
            self.destroyed.discard((old.marked_at_ms, object_id))

    def _remove_sso(self, object_id: ObjectId) -> None:
        sso = self.ssos.pop(object_id, None)
        if sso is None:
            return
        self.node_ssos[sso.node_id].discard((sso.order_id, object_id))
        for r in sso.ranges:
            self.node_stream_ssos[(sso.node_id, r.stream_id)].discard((sso.order_id, object_id, r))

    def _remove_so(self, object_id: ObjectId) -> None:
        so = self.sos.pop(object_id, None)
        if so is not None and so.stream_id in self.stream_sos:
            self.stream_sos[so.stream_id].discard((so.start_offset, object_id))


class MemoryMetadataStore(TransactionalStore):
    """A MetadataStore kept in memory; same semantics as :class:`~s3stream.metadata.sqlite.SqliteMetadataStore`."""

    def __init__(self, *, clock_ms: Clock = wall_clock_ms) -> None:
        super().__init__(clock_ms)
        self._state = _State()
        self._view: ctl.StateView = self._state
        self._closed = False

    async def _transact(self, fn: Callable[[ctl.Txn], T]) -> T:
        self._check_open()
        txn = ctl.Txn(self._view)
        result = fn(txn)
        self._state.apply(txn.changes)
        return result

    async def _query(self, fn: Callable[[ctl.StateView], T]) -> T:
        self._check_open()
        return fn(self._view)

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("the metadata store is closed")

    async def close(self) -> None:
        self._closed = True
