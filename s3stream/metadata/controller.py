"""The metadata controller's framework: the state view, the transaction, limits and shared checks.

Pure decisions: every operation (:mod:`~s3stream.metadata.stream_ops`,
:mod:`~s3stream.metadata.object_ops`, :mod:`~s3stream.metadata.queries`) reads through a
:class:`StateView` and appends :mod:`~s3stream.metadata.changes` to a :class:`Txn`; it never mutates
state. A backend runs one operation and applies ``txn.changes`` atomically only when it returns, so an
operation that raises writes nothing. Both backends (SQLite and the in-memory twin) share these
modules, so their semantics cannot drift apart; they differ only in how they read and apply.

AutoMQ's controller checks: ``docs/automq-model.md`` section 7 (without failover mode and the later
close-first hand-off, section 13).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import NamedTuple, Protocol

from s3stream.errors import (
    ConflictError,
    ErrorCode,
    FencedError,
    InvalidArgumentError,
    NotFoundError,
)
from s3stream.ids import NodeId, ObjectId, StreamId
from s3stream.metadata.base import (
    Assignment,
    LeaseInfo,
    NodeInfo,
    NodeRuntime,
    ObjectState,
    S3ObjectMetadata,
    StreamMetadata,
    StreamObject,
    StreamOffsetRange,
    StreamSetObject,
    TakeoverInfo,
)
from s3stream.metadata.changes import (
    Change,
    Counter,
    PutStream,
)

PREPARE_MAX_COUNT = 10_000
"""Object ids one prepare_objects call may allocate."""
TTL_MAX_MS = 7 * 24 * 3600 * 1000
GET_LIMIT_MAX = 100_000
"""Largest ``limit`` of a listing query."""
RANGES_PER_COMMIT_MAX = 100_000
TAG_MAX_COUNT = 64
TAG_CHARS_MAX = 1024
KV_KEY_CHARS_MAX = 1024
KV_VALUE_MAX_BYTES = 1 << 20
OFFSET_MAX = (1 << 63) - 1
"""Offsets, epochs and ids are stored as signed 64-bit integers (SQLite INTEGER)."""


class StreamSetRange(NamedTuple):
    """One StreamSet object's range of one stream, as the read path scans them."""

    object_id: ObjectId
    order_id: int
    object_size_bytes: int
    range: StreamOffsetRange


class StreamHead(NamedTuple):
    """A stream's state, offsets and last range (the one with the highest index; -1 and -1 when it
    has no range): what the end-offset advance of a WAL upload checks and writes."""

    state: int
    start_offset: int
    end_offset: int
    range_index: int
    range_node_id: int


class StateView(Protocol):
    """Read access to the metadata state inside the running transaction."""

    def node_epoch(self, node_id: NodeId) -> int | None: ...

    def node(self, node_id: NodeId) -> NodeInfo | None: ...

    def nodes(self) -> list[NodeInfo]:
        """Every registered node, by id."""
        ...

    def lease(self, name: str) -> LeaseInfo | None:
        """The stored row of the named lease, valid or not."""
        ...

    def leases(self) -> list[LeaseInfo]:
        """Every stored lease row, by name."""
        ...

    def stream(self, stream_id: StreamId) -> StreamMetadata | None:
        """With ``ranges`` sorted by range index."""
        ...

    def stream_heads(self, stream_ids: Sequence[StreamId]) -> dict[StreamId, StreamHead]:
        """What a WAL upload's commit checks of each stream, for many at once (ids that do not
        exist are left out): one lookup, no tags and no range list built (a commit of 1,000 streams)."""
        ...

    def all_continue_at_end(self, node_id: NodeId, spans: Sequence[tuple[StreamId, int, int]]) -> bool:
        """Whether every ``(stream id, start offset, end offset)`` span starts exactly at its
        stream's end offset, the stream being OPENED, not trimmed to its end (start offset below
        end offset, integers as stored) and with a last range owned by ``node_id``: the common
        case of a WAL upload's commit, which then advances with no check per stream. False means
        nothing but "check span by span" (the SQLite view decides it in SQL, with no Python object
        per stream)."""
        ...

    def opened_streams(self) -> list[StreamMetadata]: ...

    def streams(self) -> list[StreamMetadata]:
        """Every stream, by id."""
        ...

    def objects(self, states: frozenset[ObjectState] | None) -> list[S3ObjectMetadata]:
        """Objects in the given states (all when None), by id."""
        ...

    def stream_set_objects(self, node_id: NodeId) -> list[StreamSetObject]:
        """The node's StreamSet objects by order id (then id)."""
        ...

    def destroyable(self, marked_before_ms: int, limit: int) -> list[S3ObjectMetadata]:
        """MARK_DESTROYED objects with ``marked_at_ms < marked_before_ms``, by mark time then id."""
        ...

    def object(self, object_id: ObjectId) -> S3ObjectMetadata | None: ...

    def stream_set_object(self, object_id: ObjectId) -> StreamSetObject | None: ...

    def stream_object(self, object_id: ObjectId) -> StreamObject | None: ...

    def stream_objects_from(self, stream_id: StreamId, offset: int, limit: int) -> list[StreamObject]:
        """The stream's stream objects ending after ``offset``, by start offset (then id)."""
        ...

    def stream_set_ranges_from(
        self, node_id: NodeId, stream_id: StreamId, offset: int, *, after: tuple[int, int] | None, limit: int
    ) -> list[StreamSetRange]:
        """The node's StreamSet-object ranges of the stream ending after ``offset``, by (order id, id),
        starting after the key ``after`` (None: from the first), at most ``limit``."""
        ...

    def expired_prepared(self, now_ms: int) -> list[S3ObjectMetadata]:
        """PREPARED objects with ``expires_at_ms < now_ms``, by id."""
        ...

    def next_id(self, counter: Counter) -> int: ...

    def kv(self, key: str) -> bytes | None: ...

    # -- cluster (s3stream.metadata.cluster_ops) ---------------------------------------------------
    def node_runtime(self, node_id: NodeId) -> NodeRuntime | None: ...

    def node_runtimes(self) -> list[NodeRuntime]:
        """Every node runtime row, by node id."""
        ...

    def assignment(self, stream_id: StreamId) -> Assignment | None: ...

    def assignments(self) -> list[Assignment]:
        """Every assignment row, by stream id."""
        ...

    def takeover(self, node_id: NodeId) -> TakeoverInfo | None: ...

    def takeovers(self) -> list[TakeoverInfo]:
        """Every takeover row, by node id."""
        ...

    # -- object placement (s3stream.metadata.placement_ops) ----------------------------------------
    def placements(self, object_ids: Sequence[ObjectId]) -> dict[ObjectId, tuple[int, ...]]:
        """The recorded bucket ids (ascending) of each given object that has any."""
        ...

    def bucket_usage(self, unplaced_bucket_id: int) -> dict[int, tuple[int, int]]:
        """``{bucket id: (objects, bytes)}`` over COMMITTED objects (no rows: ``unplaced_bucket_id``)."""
        ...


class Txn:
    """One operation's view plus the changes it has decided so far."""

    __slots__ = ("changes", "view")

    def __init__(self, view: StateView) -> None:
        self.view = view
        self.changes: list[Change] = []

    def write(self, change: Change) -> None:
        self.changes.append(change)


# -- argument checks -----------------------------------------------------------------------------


def check_int(name: str, value: object, *, low: int, high: int = OFFSET_MAX) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise InvalidArgumentError(f"{name} must be an integer in [{low}, {high}], got {value!r}")


def check_node(node_id: int, node_epoch: int) -> None:
    check_int("node_id", node_id, low=0)
    check_int("node_epoch", node_epoch, low=0)


def check_tags(tags: Mapping[str, str]) -> None:
    if len(tags) > TAG_MAX_COUNT:
        raise InvalidArgumentError(f"at most {TAG_MAX_COUNT} tags, got {len(tags)}")
    for key, value in tags.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise InvalidArgumentError(f"tags must map str to str, got {key!r}: {value!r}")
        if not key or len(key) > TAG_CHARS_MAX or len(value) > TAG_CHARS_MAX:
            raise InvalidArgumentError(f"tag key must be 1..{TAG_CHARS_MAX} chars, value at most that")


def check_span(what: str, start_offset: int, end_offset: int) -> None:
    check_int(f"{what} start_offset", start_offset, low=0)
    check_int(f"{what} end_offset", end_offset, low=0)
    if start_offset >= end_offset:
        raise InvalidArgumentError(
            f"{what} must satisfy start_offset < end_offset, got [{start_offset}, {end_offset})"
        )


# -- shared checks (docs/automq-model.md section 7) -----------------------------------------------


def node_epoch_check(view: StateView, node_id: NodeId, node_epoch: int) -> None:
    stored = view.node_epoch(node_id)
    if stored is None:
        raise NotFoundError(f"node {node_id} is not registered", code=ErrorCode.NODE_EPOCH_NOT_EXIST)
    if stored > node_epoch:
        raise FencedError(
            f"node {node_id} epoch {node_epoch} is older than the registered {stored}",
            code=ErrorCode.NODE_EPOCH_EXPIRED,
        )


def ownership_check(view: StateView, stream_id: StreamId, epoch: int, node_id: NodeId) -> StreamMetadata:
    stream = view.stream(stream_id)
    if stream is None:
        raise NotFoundError(f"stream {stream_id} does not exist", code=ErrorCode.STREAM_NOT_EXIST)
    if stream.epoch > epoch:
        raise FencedError(
            f"stream {stream_id} epoch {epoch} is fenced by epoch {stream.epoch}",
            code=ErrorCode.STREAM_FENCED,
        )
    if stream.epoch < epoch:
        raise ConflictError(
            f"stream {stream_id} epoch {epoch} is newer than its epoch {stream.epoch}",
            code=ErrorCode.STREAM_INNER_ERROR,
        )
    if not stream.ranges:
        raise ConflictError(f"stream {stream_id} has no current range", code=ErrorCode.STREAM_INNER_ERROR)
    owner = stream.ranges[-1].node_id
    if owner != node_id:
        raise FencedError(
            f"stream {stream_id} is owned by node {owner}, not node {node_id}", code=ErrorCode.STREAM_FENCED
        )
    return stream


def put_stream(txn: Txn, stream: StreamMetadata) -> None:
    txn.write(
        PutStream(
            stream_id=stream.stream_id,
            epoch=stream.epoch,
            state=stream.state,
            start_offset=stream.start_offset,
            end_offset=stream.end_offset,
            tags=stream.tags,
        )
    )


def marked(obj: S3ObjectMetadata, now_ms: int) -> S3ObjectMetadata:
    """The object in state MARK_DESTROYED since ``now_ms``."""
    return dataclasses.replace(obj, state=ObjectState.MARK_DESTROYED, marked_at_ms=now_ms)
