"""SQLite and the in-memory twin agree on random operation sequences: same results, same errors
(kind and code), same observable state after every step."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from s3stream.errors import S3StreamError
from s3stream.ids import NOOP_OBJECT_ID, NodeId, ObjectId, StreamId
from s3stream.metadata.base import (
    CommitStreamObjectRequest,
    MetadataStore,
    ObjectState,
    StreamState,
)
from s3stream.metadata.memory import MemoryMetadataStore
from s3stream.metadata.sqlite import SqliteMetadataStore
from s3stream.metadata.store import TransactionalStore
from tests.support.metadata_contract import FakeClock, nodes_and_leases, snapshot, sso_request

NODES = st.sampled_from([NodeId(1), NodeId(2), NodeId(3)])
NODE_EPOCHS = st.integers(min_value=0, max_value=3)
STREAM_EPOCHS = st.integers(min_value=0, max_value=4)
KEYS = st.sampled_from(["a", "b"])
LEASES_MS = st.sampled_from([500, 2_000])
LEASE_NAMES = st.sampled_from(["maintenance", "other"])


class _Twins(RuleBasedStateMachine):
    """A memory and a SQLite store on one fake clock; ``both`` runs a call on each and compares."""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.dir = tempfile.mkdtemp(prefix="s3stream-twins-")
        self.clock = FakeClock()
        self.memory = MemoryMetadataStore(clock_ms=self.clock)
        path = Path(self.dir) / "meta.db"
        self.sqlite = self.loop.run_until_complete(
            SqliteMetadataStore.open(path, clock_ms=self.clock, check_integrity=False)
        )
        self.node_epochs: dict[int, int] = {}

    def teardown(self) -> None:
        self.loop.run_until_complete(self.sqlite.close())
        self.loop.run_until_complete(self.memory.close())
        self.loop.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def both(self, call: Callable[[MetadataStore], Awaitable[Any]]) -> Any:
        outcomes = []
        for store in (self.memory, self.sqlite):
            try:
                outcomes.append(("ok", self.loop.run_until_complete(call(store))))
            except S3StreamError as exc:
                outcomes.append(("error", type(exc).__name__, exc.code))
        assert outcomes[0] == outcomes[1], f"memory {outcomes[0]!r} != sqlite {outcomes[1]!r}"
        return outcomes[0][1] if outcomes[0][0] == "ok" else None

    def memory_state(self, call: Callable[[MetadataStore], Awaitable[Any]]) -> Any:
        return self.loop.run_until_complete(call(self.memory))

    def epoch_of(self, node_id: NodeId) -> int:
        return self.node_epochs.get(node_id, 0)


class TwinStores(_Twins):
    def stream_ids(self) -> list[StreamId]:
        streams = self.memory_state(lambda s: s.list_streams())
        return [s.stream_id for s in streams] + [StreamId(len(streams) + 5)]

    # -- nodes and streams ----------------------------------------------------------------------

    @rule(node_id=NODES, node_epoch=NODE_EPOCHS)
    def register_node(self, node_id: NodeId, node_epoch: int) -> None:
        if self.both(lambda s: s.register_node(node_id=node_id, node_epoch=node_epoch)) is not None:
            self.node_epochs[node_id] = node_epoch

    @rule(node_id=NODES, tagged=st.booleans())
    def create_stream(self, node_id: NodeId, tagged: bool) -> None:
        tags = {"topic": "t"} if tagged else None
        self.both(lambda s: s.create_stream(node_id=node_id, node_epoch=self.epoch_of(node_id), tags=tags))

    @initialize(streams=st.integers(min_value=1, max_value=3))
    def nodes_and_streams(self, streams: int) -> None:
        for node_id in (1, 2, 3):
            self.register_node(NodeId(node_id), 0)
        for i in range(streams):
            node_id = NodeId(1 + i % 3)
            self.create_stream(node_id, tagged=i == 0)
            self.both(
                lambda s, i=i, node_id=node_id: s.open_stream(
                    node_id=node_id, node_epoch=0, stream_id=StreamId(i), epoch=0
                )
            )

    @rule(data=st.data(), node_id=NODES, op=st.sampled_from(["open", "close"]))
    def open_or_close(self, data: st.DataObject, node_id: NodeId, op: str) -> None:
        streams = self.memory_state(lambda s: s.list_streams())
        known = [s.stream_id for s in streams]
        stream_id = (
            data.draw(st.sampled_from(known)) if known and data.draw(st.integers(0, 9)) else StreamId(99)
        )
        current = next((s.epoch for s in streams if s.stream_id == stream_id), 0)
        epoch = max(0, current + data.draw(st.sampled_from([0, 1, 1, -1, 2])))
        if data.draw(st.integers(0, 3)):  # mostly the owner for close, anyone for open
            owner = next(
                (s.ranges[-1].node_id for s in streams if s.stream_id == stream_id and s.ranges), node_id
            )
            node_id = owner if op == "close" else node_id
        node_epoch = self.epoch_of(node_id)
        if op == "open":
            self.both(
                lambda s: s.open_stream(
                    node_id=node_id, node_epoch=node_epoch, stream_id=stream_id, epoch=epoch
                )
            )
        else:
            self.both(
                lambda s: s.close_stream(
                    node_id=node_id, node_epoch=node_epoch, stream_id=stream_id, epoch=epoch
                )
            )

    @rule(data=st.data(), delta=st.integers(min_value=-5, max_value=40))
    def trim_stream(self, data: st.DataObject, delta: int) -> None:
        streams = self.memory_state(lambda s: s.list_streams())
        if not streams:
            return
        stream = data.draw(st.sampled_from(streams))
        owner = stream.ranges[-1].node_id if stream.ranges else NodeId(1)
        new_start = max(0, stream.start_offset + delta)
        self.both(
            lambda s: s.trim_stream(
                node_id=owner,
                node_epoch=self.epoch_of(owner),
                stream_id=stream.stream_id,
                epoch=max(stream.epoch, 0),
                new_start_offset=new_start,
            )
        )

    @rule(data=st.data())
    def delete_stream(self, data: st.DataObject) -> None:
        stream_id = data.draw(st.sampled_from(self.stream_ids()))
        self.both(lambda s: s.delete_stream(stream_id=stream_id, epoch=0))

    # -- objects --------------------------------------------------------------------------------

    @rule(count=st.integers(min_value=1, max_value=4), ttl_ms=st.sampled_from([10, 5_000]))
    def prepare_objects(self, count: int, ttl_ms: int) -> None:
        self.both(lambda s: s.prepare_objects(count=count, ttl_ms=ttl_ms))

    def _object_ids(self, states: list[ObjectState]) -> list[int]:
        ids = [o.object_id for o in self.memory_state(lambda s: s.list_objects(states))]
        return [*ids, NOOP_OBJECT_ID, 999]

    @rule(data=st.data(), node_id=NODES, compaction=st.booleans())
    def commit_stream_set_object(self, data: st.DataObject, node_id: NodeId, compaction: bool) -> None:
        prepared = self._object_ids([ObjectState.PREPARED])
        object_id = data.draw(st.sampled_from(prepared))
        streams = self.memory_state(lambda s: s.list_streams())
        owned = [s for s in streams if s.ranges and s.ranges[-1].node_id == node_id]
        streams = owned if owned and data.draw(st.integers(0, 3)) else streams
        chosen = (
            data.draw(st.lists(st.sampled_from(streams), max_size=3, unique_by=lambda s: s.stream_id))
            if streams
            else []
        )
        spans = []
        for stream in sorted(chosen, key=lambda s: s.stream_id):
            start = stream.end_offset if data.draw(st.integers(0, 4)) else data.draw(st.integers(0, 60))
            spans.append((stream.stream_id, start, start + data.draw(st.integers(1, 20))))
        object_count = data.draw(st.integers(0, len(spans))) if object_id != NOOP_OBJECT_ID else len(spans)
        so_ids = [i for i in prepared if i not in (object_id, NOOP_OBJECT_ID, 999)][:object_count]
        ranges = spans[: len(spans) - len(so_ids)]
        sos = [(so_id, *span) for so_id, span in zip(so_ids, spans[len(ranges) :], strict=True)]
        compacted: list[int] = []
        if compaction:
            live = self._object_ids([ObjectState.COMMITTED, ObjectState.PREPARED])
            compacted = data.draw(st.lists(st.sampled_from(live), max_size=3, unique=True))
            compacted = [c for c in compacted if c not in (object_id, NOOP_OBJECT_ID) and c not in so_ids]
        if object_id == NOOP_OBJECT_ID:
            ranges = []
        order_id = -1 if compaction else object_id
        node_epoch = self.epoch_of(node_id)

        request = sso_request(
            node_id,
            ObjectId(object_id),
            ranges,
            sos,
            compacted=compacted,
            order_id=order_id,
            node_epoch=node_epoch,
        )
        self.both(lambda s: s.commit_stream_set_object(request))

    @rule(data=st.data(), skip_ownership=st.booleans())
    def commit_stream_object(self, data: st.DataObject, skip_ownership: bool) -> None:
        streams = self.memory_state(lambda s: s.list_streams())
        if not streams:
            return
        stream = data.draw(st.sampled_from(streams))
        sos = self.memory_state(
            lambda s: s.get_stream_objects(
                stream_id=stream.stream_id, start_offset=0, end_offset=-1, limit=100
            )
        )
        sources = data.draw(
            st.lists(st.sampled_from([so.object_id for so in sos] + [999]), max_size=3, unique=True)
        )
        object_id = data.draw(st.sampled_from(self._object_ids([ObjectState.PREPARED])))
        if object_id in sources:
            return
        covered = [so for so in sos if so.object_id in sources]
        start = min((so.start_offset for so in covered), default=stream.end_offset)
        end = max((so.end_offset for so in covered), default=start + 5)
        owner = stream.ranges[-1].node_id if stream.ranges else NodeId(1)
        request = CommitStreamObjectRequest(
            object_id=ObjectId(object_id),
            object_size_bytes=10 * (end - start),
            stream_id=stream.stream_id,
            stream_epoch=-1 if skip_ownership else max(stream.epoch, 0),
            start_offset=start,
            end_offset=end,
            source_object_ids=tuple(ObjectId(s) for s in sources),
            node_id=owner,
            node_epoch=self.epoch_of(owner),
        )
        self.both(lambda s: s.commit_stream_object(request))

    @rule(advance_ms=st.integers(min_value=0, max_value=8_000))
    def expire_prepared(self, advance_ms: int) -> None:
        self.clock.advance(advance_ms)
        self.both(lambda s: s.expire_prepared(now_ms=self.clock.now_ms))

    @rule(data=st.data())
    def mark_destroyed(self, data: st.DataObject) -> None:
        ids = data.draw(
            st.lists(
                st.sampled_from(self._object_ids([ObjectState.COMMITTED, ObjectState.PREPARED])),
                max_size=2,
                unique=True,
            )
        )
        ids = [i for i in ids if i >= 0]
        self.both(lambda s: s.mark_destroyed([ObjectId(i) for i in ids], now_ms=self.clock.now_ms))

    @rule(data=st.data(), limit=st.integers(min_value=1, max_value=5))
    def remove_destroyable(self, data: st.DataObject, limit: int) -> None:
        ready = self.both(
            lambda s: s.destroyable_objects(marked_before_ms=self.clock.now_ms + 1, limit=limit)
        )
        ids = [o.object_id for o in ready]
        if data.draw(st.booleans()):
            ids += [
                ObjectId(i)
                for i in data.draw(
                    st.lists(st.sampled_from(self._object_ids([ObjectState.COMMITTED])), max_size=1)
                )
                if i >= 0
            ]
        self.both(lambda s: s.remove_objects(ids))

    @rule(data=st.data(), limit=st.integers(min_value=1, max_value=6))
    def get_objects(self, data: st.DataObject, limit: int) -> None:
        stream_id = data.draw(st.sampled_from(self.stream_ids()))
        start = data.draw(st.integers(0, 80))
        end = data.draw(st.sampled_from([-1, start + 1, start + 30]))
        self.both(
            lambda s: s.get_objects(stream_id=stream_id, start_offset=start, end_offset=end, limit=limit)
        )

    # -- KV -------------------------------------------------------------------------------------

    @rule(key=KEYS, value=st.binary(max_size=8), overwrite=st.booleans())
    def kv_put(self, key: str, value: bytes, overwrite: bool) -> None:
        self.both(lambda s: s.kv_put(key, value, overwrite=overwrite))

    @rule(key=KEYS)
    def kv_delete(self, key: str) -> None:
        self.both(lambda s: s.kv_delete(key))

    # -- the state ------------------------------------------------------------------------------

    @invariant()
    def same_state(self) -> None:
        memory = self.loop.run_until_complete(snapshot(self.memory))
        sqlite = self.loop.run_until_complete(snapshot(self.sqlite))
        assert memory == sqlite

    @invariant()
    def stream_invariants(self) -> None:
        for stream in self.memory_state(lambda s: s.list_streams()):
            assert stream.start_offset <= stream.end_offset
            if stream.state == StreamState.OPENED:
                assert stream.ranges
            indexes = [r.range_index for r in stream.ranges]
            assert indexes == sorted(indexes)


TwinStores.TestCase.settings = settings(
    max_examples=25,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_sqlite_and_memory_agree = TwinStores.TestCase


class TwinNodes(_Twins):
    """Node sessions, leases and bound writes, densely: the same results, errors and sessions."""

    @rule(node_id=NODES, node_epoch=NODE_EPOCHS)
    def register_node(self, node_id: NodeId, node_epoch: int) -> None:
        if self.both(lambda s: s.register_node(node_id=node_id, node_epoch=node_epoch)) is not None:
            self.node_epochs[node_id] = node_epoch

    @rule(node_id=NODES, lease_ms=LEASES_MS)
    def open_node(self, node_id: NodeId, lease_ms: int) -> None:
        info = self.both(lambda s: s.open_node(node_id=node_id, lease_ms=lease_ms))
        if info is not None:
            self.node_epochs[node_id] = info.node_epoch

    @rule(node_id=NODES, stale=st.booleans(), lease_ms=LEASES_MS)
    def heartbeat(self, node_id: NodeId, stale: bool, lease_ms: int) -> None:
        epoch = max(0, self.epoch_of(node_id) - stale)
        self.both(lambda s: s.heartbeat(node_id=node_id, node_epoch=epoch, lease_ms=lease_ms))

    @rule(node_id=NODES, stale=st.booleans())
    def close_node(self, node_id: NodeId, stale: bool) -> None:
        epoch = max(0, self.epoch_of(node_id) - stale)
        self.both(lambda s: s.close_node(node_id=node_id, node_epoch=epoch))

    @rule(name=LEASE_NAMES, node_id=NODES, stale=st.booleans(), lease_ms=LEASES_MS)
    def acquire_lease(self, name: str, node_id: NodeId, stale: bool, lease_ms: int) -> None:
        epoch = max(0, self.epoch_of(node_id) - stale)
        self.both(lambda s: s.acquire_lease(name=name, node_id=node_id, node_epoch=epoch, lease_ms=lease_ms))

    @rule(name=LEASE_NAMES, node_id=NODES, stale=st.booleans())
    def release_lease(self, name: str, node_id: NodeId, stale: bool) -> None:
        epoch = max(0, self.epoch_of(node_id) - stale)
        self.both(lambda s: s.release_lease(name=name, node_id=node_id, node_epoch=epoch))

    @rule(advance_ms=st.integers(min_value=0, max_value=1_500))
    def time_passes(self, advance_ms: int) -> None:
        self.clock.advance(advance_ms)

    @rule(
        node_id=NODES,
        stale=st.booleans(),
        lease=st.sampled_from([None, "maintenance"]),
        value=st.binary(max_size=4),
    )
    def bound_kv_put(self, node_id: NodeId, stale: bool, lease: str | None, value: bytes) -> None:
        """A write through a store bound to a session (and a lease): written or fenced, alike."""
        epoch = max(0, self.epoch_of(node_id) - stale)

        async def put(store: MetadataStore) -> bytes:
            assert isinstance(store, TransactionalStore)
            store.bind_node(node_id, epoch)
            try:
                target = store if lease is None else store.bind_lease(lease)
                return await target.kv_put("a", value)
            finally:
                store._guard = None  # unbound again for the other rules

        self.both(put)

    @invariant()
    def same_nodes_leases_and_kv(self) -> None:
        async def state(store: MetadataStore) -> tuple[Any, ...]:
            return await nodes_and_leases(store, ["maintenance", "other"]), await store.kv_get("a")

        assert self.loop.run_until_complete(state(self.memory)) == self.loop.run_until_complete(
            state(self.sqlite)
        )


TwinNodes.TestCase.settings = settings(
    max_examples=30,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_node_sessions_and_leases_agree = TwinNodes.TestCase
