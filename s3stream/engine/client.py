"""The public async API: Client, StreamClient, Stream, KVClient (AutoMQ's ``com.automq.stream.api``).

These are thin, typed front doors over :class:`~s3stream.engine.core.Engine` (which owns every
behaviour) and the metadata store (streams, KV). ``s3stream.open`` (:func:`s3stream.assembly.open_client`)
builds the components and hands them to a :class:`Client`; nothing in the engine imports the assembly.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, NoReturn

from s3stream.cluster.events import AssignmentHub, Subscription
from s3stream.engine.core import Engine, StreamHandle
from s3stream.engine.walbody import KV_KEY_MAX_BYTES
from s3stream.errors import ClosedError, InvalidArgumentError, UnavailableError
from s3stream.ids import NodeId, ObjectId, StreamId
from s3stream.metadata.base import (
    CommitObjectsRequest,
    CommittedObject,
    MetadataStore,
    StreamMetadata,
)
from s3stream.metadata.cluster_ops import held_by
from s3stream.metrics import NOOP_METRICS, Metrics
from s3stream.model import FetchedBatch, RecordBatch


def _check_batch(batch: RecordBatch) -> RecordBatch:
    if not isinstance(batch, RecordBatch):
        raise InvalidArgumentError(f"expected a RecordBatch, got {type(batch).__name__}")
    if len(batch.payload) == 0:
        raise InvalidArgumentError("record batch payload is empty")
    return batch


def _check_stream_id(stream_id: object) -> StreamId:
    if isinstance(stream_id, bool) or not isinstance(stream_id, int) or stream_id < 0:
        raise InvalidArgumentError(f"stream id must be a non-negative int, got {stream_id!r}")
    return StreamId(stream_id)


def _check_expected_offset(offset: object) -> int | None:
    if offset is None:
        return None
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise InvalidArgumentError(f"expected offset must be a non-negative int or None, got {offset!r}")
    return offset


async def _raise(exc: BaseException) -> NoReturn:
    raise exc


RESERVED_KV_PREFIX = "\x00s3stream."
"""KV keys starting with this are the engine's own (in the metadata store's KV, never through the WAL)."""


def _check_key(key: str) -> str:
    if not isinstance(key, str) or not key:
        raise InvalidArgumentError(f"KV key must be a non-empty str, got {key!r}")
    if key.startswith(RESERVED_KV_PREFIX):
        raise InvalidArgumentError(f"KV keys starting with {RESERVED_KV_PREFIX!r} are reserved, got {key!r}")
    try:
        key_bytes = key.encode()
    except UnicodeEncodeError as exc:
        raise InvalidArgumentError(f"KV key {key!r} is not encodable as UTF-8: {exc.reason}") from exc
    if len(key_bytes) > KV_KEY_MAX_BYTES:
        raise InvalidArgumentError(f"KV key of {len(key_bytes)} bytes is above {KV_KEY_MAX_BYTES}")
    return key


def _check_value(value: bytes) -> bytes:
    if not isinstance(value, bytes | bytearray | memoryview):
        raise InvalidArgumentError(f"KV value must be bytes, got {type(value).__name__}")
    return bytes(value)


class Stream:
    """One open stream. Offsets: ``[start_offset, confirm_offset)`` readable, ``next_offset`` next to assign."""

    def __init__(self, engine: Engine, handle: StreamHandle) -> None:
        self._engine = engine
        self._handle = handle
        self._append_one = engine.append_one

    @property
    def stream_id(self) -> StreamId:
        return self._handle.stream_id

    @property
    def epoch(self) -> int:
        return self._handle.epoch

    @property
    def start_offset(self) -> int:
        return self._handle.start_offset

    @property
    def confirm_offset(self) -> int:
        return self._handle.confirm_offset

    @property
    def next_offset(self) -> int:
        return self._handle.next_offset

    @property
    def handle(self) -> StreamHandle:
        return self._handle

    @property
    def engine(self) -> Engine:
        return self._engine

    def append(self, batch: RecordBatch, expected_offset: int | None = None) -> Coroutine[Any, Any, int]:
        """Append a batch; awaiting the result returns its base offset once it is durable in the WAL.

        Used as ``await stream.append(batch)``, exactly like a coroutine function: it returns the
        engine's append coroutine itself (one coroutine frame less per append) and raises nothing
        before the await (an invalid batch's error comes from awaiting, as it would from an ``async def``).

        ``expected_offset``: append only if the batch gets this base offset, i.e. the stream's next
        offset is this one when the engine assigns offsets; otherwise ConflictError and nothing is
        appended (no offset taken, nothing in the WAL, the stream stays open).
        """
        if expected_offset is not None:
            return self._append_expected(batch, expected_offset)
        if type(batch) is not RecordBatch or not batch.payload:
            try:
                batch = _check_batch(batch)
            except InvalidArgumentError as exc:
                return _raise(exc)
        payload = batch.payload
        if type(payload) is not bytes:
            payload = bytes(payload)  # the caller may reuse its buffer once the append returns
        return self._append_one(self._handle, payload, batch.count)

    async def _append_expected(self, batch: RecordBatch, expected_offset: int) -> int:
        """A conditional append: the engine's group path (``append_one`` has no offset check)."""
        batch = _check_batch(batch)
        expected = _check_expected_offset(expected_offset)
        (base,) = await self._engine.append(
            [(self._handle, bytes(batch.payload), batch.count)], (), [expected]
        )
        return base

    async def fetch(self, start_offset: int, end_offset: int, max_bytes: int = 1 << 20) -> list[FetchedBatch]:
        """Batches covering ``[start_offset, end_offset)`` in order (whole batches; at least one)."""
        return await self._engine.fetch(self._handle, start_offset, end_offset, max_bytes)

    async def trim(self, new_start_offset: int) -> None:
        await self._engine.trim_stream(self._handle, new_start_offset)

    async def close(self) -> None:
        """Close: waits for pending appends and forces this stream's data up to object storage."""
        await self._engine.close_stream(self._handle)

    async def destroy(self) -> None:
        await self._engine.destroy_stream(self._handle)

    async def __aenter__(self) -> Stream:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        h = self._handle
        return (
            f"Stream(id={h.stream_id}, epoch={h.epoch}, start={h.start_offset}, confirm={h.confirm_offset}, "
            f"next={h.next_offset}, {h.status.value})"
        )


DESCRIBES_MAX = 8
"""``reassign`` checks at most this many streams one by one per poll; more: one ``list_streams``."""


class StreamClient:
    def __init__(self, engine: Engine, metadata: MetadataStore, hub: AssignmentHub | None = None) -> None:
        self._engine = engine
        self._metadata = metadata
        self._hub = hub or AssignmentHub()

    async def reassign(
        self, stream_ids: Iterable[StreamId], to_node: int, *, timeout_s: float = 30.0
    ) -> None:
        """Move the streams to node ``to_node`` (one request for all of them) and return once every one
        is held open by that node; UnavailableError naming the others when ``timeout_s`` passes first
        (the request stands: the move goes on). NotFoundError for an unknown stream (STREAM_NOT_EXIST)
        or a node with no live session (NODE_NOT_ALIVE); nothing is requested then.

        The owner stops taking appends of each stream (MovedError naming ``to_node``), uploads its
        data and closes it; ``to_node`` opens it at the next epoch (``docs/architecture.md``,
        reassignment)."""
        ids = [_check_stream_id(s) for s in stream_ids]
        if isinstance(to_node, bool) or not isinstance(to_node, int) or to_node < 0:
            raise InvalidArgumentError(f"to_node must be a node id (a non-negative int), got {to_node!r}")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or timeout_s < 0:
            raise InvalidArgumentError(f"timeout_s must be a non-negative number, got {timeout_s!r}")
        if not ids:
            return
        await self._metadata.request_reassign(stream_ids=ids, to_node_id=NodeId(to_node))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        poll_s = self._engine.config.cluster_poll_ms / 1000
        waiting = list(dict.fromkeys(ids))
        while True:
            # Held: OPENED on to_node with no row left (a stream sent back to its owner mid-move is
            # still OPENED there until the move closes it; the owner's reopen removes the row).
            rows = {row.stream_id for row in await self._metadata.list_assignments()}
            if len(waiting) > DESCRIBES_MAX:  # one listing instead of many describes
                held = {m.stream_id for m in await self._metadata.list_streams() if held_by(m, to_node)}
            else:
                held = {sid for sid in waiting if held_by(await self._metadata.describe_stream(sid), to_node)}
            waiting = [sid for sid in waiting if sid not in held or sid in rows]
            if not waiting:
                return
            if loop.time() >= deadline:
                raise UnavailableError(
                    f"reassign to node {to_node}: streams {waiting[:20]} not open there after {timeout_s} s "
                    "(the request stands; the move may still complete)"
                )
            await asyncio.sleep(min(poll_s, max(deadline - loop.time(), 0.0)))

    def assignments(self) -> Subscription:
        """The streams this node gains and loses from now on: an async iterator of
        :class:`~s3stream.cluster.events.AssignmentEvent` (``kind`` "gained" with the open ``stream``,
        or "lost"). Each call is a new subscriber; see :mod:`s3stream.cluster.events` for what
        happens to a subscriber that falls too far behind, and when the iterator ends."""
        return self._hub.subscribe()

    async def create_stream(self, *, tags: Mapping[str, str] | None = None) -> StreamId:
        return await self._engine.create_stream(tags)

    async def create_and_open_stream(
        self, *, epoch: int = 0, tags: Mapping[str, str] | None = None
    ) -> Stream:
        stream_id = await self.create_stream(tags=tags)
        return await self.open_stream(stream_id, epoch=epoch)

    async def open_stream(self, stream_id: StreamId, *, epoch: int) -> Stream:
        """Open with ``epoch``: FencedError if the stream already has a newer one."""
        return Stream(self._engine, await self._engine.open_stream(stream_id, epoch))

    async def list_streams(self) -> list[StreamMetadata]:
        return await self._metadata.list_streams()


class KVClient:
    """Small metadata key/values (AutoMQ's KVClient); keys are strings, values bytes.

    Every change goes through the WAL and is applied in WAL order (``s3stream.engine.kvlog``), so
    it is ordered with atomic groups' KV puts, also across a crash.
    """

    def __init__(self, engine: Engine, alive: Callable[[], None]) -> None:
        self._engine = engine
        self._alive = alive

    async def put_if_absent(self, key: str, value: bytes) -> bytes:
        """Store unless present; returns the value now stored."""
        self._alive()
        return await self._engine.kv_put(_check_key(key), _check_value(value), overwrite=False)

    async def put(self, key: str, value: bytes) -> bytes:
        self._alive()
        return await self._engine.kv_put(_check_key(key), _check_value(value), overwrite=True)

    async def get(self, key: str) -> bytes | None:
        self._alive()
        return await self._engine.kv_get(_check_key(key))

    async def delete(self, key: str) -> bytes | None:
        """Delete; returns the value it had (None if absent)."""
        self._alive()
        return await self._engine.kv_delete(_check_key(key))


class Client:
    """An open engine on one data dir. Build with ``s3stream.open`` (the assembly)."""

    def __init__(
        self,
        engine: Engine,
        metadata: MetadataStore,
        *,
        closers: Sequence[Callable[[], Awaitable[None]]] = (),
        hub: AssignmentHub | None = None,
        pre_closers: Sequence[Callable[[], Awaitable[None]]] = (),
    ) -> None:
        """``closers`` run after the engine's close, ``pre_closers`` before it (the cluster watcher)."""
        self.engine = engine
        self.config = engine.config
        self._metadata = metadata
        self._closers = list(closers)
        self._pre_closers = list(pre_closers)
        self._closed = False
        self.hub = hub or AssignmentHub()
        """This node's assignment events (``client.streams.assignments()``)."""
        self.streams = StreamClient(engine, metadata, self.hub)
        self.kv = KVClient(engine, self._check_open)
        self.components: dict[str, object] = {}
        """Background components wired in by the assembly (reaper, compactor, reader), for tools and tests."""
        self.metrics: Metrics = NOOP_METRICS
        """This client's metrics (:mod:`s3stream.metrics`; the no-op twin while metrics are off)."""

    @property
    def metrics_endpoint(self) -> str | None:
        """``http://host:port/metrics`` while metrics are on (the bound port), else None."""
        return self.metrics.endpoint

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("client is closed")

    async def append_atomic(
        self,
        appends: Sequence[tuple[Stream, RecordBatch] | tuple[Stream, RecordBatch, int | None]],
        *,
        kv: Mapping[str, bytes] | None = None,
    ) -> list[int]:
        """All-or-nothing across streams and KV puts: ONE WAL record. Returns the base offsets.

        The batches become readable in every stream at once, when the group is acknowledged. A group
        that fails (its WAL write, or one of its streams failing while it is in flight) is readable
        in none and fences every stream it touches (see :mod:`s3stream.engine.sequencer`).

        An entry ``(stream, batch, expected_base_offset)`` makes the group conditional: if any such
        batch would get another base offset (its stream's next offset, plus the counts of the
        group's earlier batches of that stream, when the engine assigns offsets), the whole group
        fails with ConflictError and nothing of it is appended (no offset taken, nothing in the WAL,
        no KV put, no stream fenced). ``None`` or a pair: no condition on that batch."""
        self._check_open()
        if not isinstance(appends, Iterable) or isinstance(appends, Stream):
            raise InvalidArgumentError(
                f"appends must be a sequence of (Stream, RecordBatch[, expected offset]) tuples, "
                f"got {type(appends).__name__}"
            )
        entries = []
        expected: list[int | None] = []
        for item in appends:
            if not isinstance(item, tuple) or len(item) not in (2, 3) or not isinstance(item[0], Stream):
                raise InvalidArgumentError(
                    "appends must be (Stream, RecordBatch) or (Stream, RecordBatch, expected offset) tuples"
                )
            stream, batch = item[0], item[1]
            if stream.engine is not self.engine:
                raise InvalidArgumentError(f"stream {stream.stream_id} belongs to another client")
            batch = _check_batch(batch)
            entries.append((stream.handle, bytes(batch.payload), batch.count))
            expected.append(_check_expected_offset(item[2]) if len(item) == 3 else None)
        if kv is not None and not isinstance(kv, Mapping):
            raise InvalidArgumentError(
                f"kv must be a mapping of str keys to bytes values, got {type(kv).__name__}"
            )
        puts = [(_check_key(k), _check_value(v)) for k, v in (kv or {}).items()]
        if not entries and not puts:
            raise InvalidArgumentError("append_atomic needs at least one append or KV put")
        conditional = any(e is not None for e in expected)
        return await self.engine.append(entries, puts, expected if conditional else None)

    # -- external commits (objects written outside the WAL; s3stream.engine.external) ------------
    async def prepare_objects(self, count: int, *, ttl_ms: int | None = None) -> ObjectId:
        """Allocate ``count`` consecutive PREPARED object ids for objects written elsewhere (the first
        is returned); ids never committed expire after ``ttl_ms`` (default ``s3.object.prepared.ttl.ms``)
        and are garbage-collected."""
        self._check_open()
        ttl = self.config.object_prepared_ttl_ms if ttl_ms is None else ttl_ms
        return await self._metadata.prepare_objects(count=count, ttl_ms=ttl)

    async def commit_objects(
        self,
        streams: Sequence[Stream],
        objects: Sequence[CommittedObject],
        *,
        kv_puts: Mapping[str, bytes] | None = None,
        kv_expect: Mapping[str, bytes | None] | None = None,
        release_ids: Sequence[ObjectId] = (),
    ) -> None:
        """Commit prepared objects written outside the WAL (e.g. by Spark executors), all or nothing,
        with KV puts under ``s3stream.engine.kvlog.DIRECT_KV_PREFIX`` conditional on ``kv_expect``
        (ConflictError(KV_CONDITION_FAILED) otherwise) and the ``release_ids`` of losing attempts
        marked destroyed. ``streams``: every stream the objects hold, open in this client; they are
        reserved (appends to them raise ConflictError meanwhile), drained and uploaded first, and
        their next and confirm offsets move to the new ends. Each stream's ranges, in ``objects``
        order, must continue exactly at its next offset. See
        :meth:`s3stream.metadata.base.MetadataStore.commit_objects` and :mod:`s3stream.engine.external`."""
        self._check_open()
        for stream in streams:
            if not isinstance(stream, Stream) or stream.engine is not self.engine:
                raise InvalidArgumentError(f"{stream!r} is not a stream of this client")
        request = CommitObjectsRequest(
            node_id=self.engine.node_id,
            node_epoch=self.engine.node_epoch,
            objects=tuple(objects),
            stream_epochs={s.stream_id: s.epoch for s in streams},
            kv_puts=dict(kv_puts or {}),
            kv_expect=dict(kv_expect or {}),
            release_ids=tuple(release_ids),
        )
        await self.engine.commit_external([s.handle for s in streams], request)

    async def settle_external(self, streams: Sequence[Stream]) -> int:
        """Settle streams a :meth:`commit_objects` with an unknown outcome (e.g. UnavailableError from
        the metadata store) left reserved, for a caller that will not send the same request again
        (e.g. its progress record shows the commit happened): each stream's next and confirm offsets
        become the metadata's end offset and appends are accepted again. Streams not left reserved
        by a commit are untouched. Returns how many were settled; see
        :func:`s3stream.engine.external.settle_external`."""
        self._check_open()
        for stream in streams:
            if not isinstance(stream, Stream) or stream.engine is not self.engine:
                raise InvalidArgumentError(f"{stream!r} is not a stream of this client")
        return await self.engine.settle_external([s.handle for s in streams])

    async def close(self) -> None:
        """Close every open stream (forcing its data up), then the engine and its components."""
        if self._closed:
            return
        self._closed = True
        try:
            try:
                for closer in self._pre_closers:
                    await closer()
            finally:
                await self.engine.close()
        finally:
            self.hub.close()
            for closer in self._closers:
                await closer()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
