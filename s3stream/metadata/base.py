"""The MetadataStore protocol: streams, epochs, objects and their lifecycle, KV pairs.

Semantics follow AutoMQ's controller (``docs/automq-model.md`` sections 1, 7 and 8): every operation checks
its preconditions in AutoMQ's order and raises an :class:`~s3stream.errors.S3StreamError` subclass carrying
the AutoMQ :class:`~s3stream.errors.ErrorCode`; every operation is atomic. Two implementations: SQLite
(durable, embedded) and an in-memory twin.

Error mapping (code -> exception kind):
STREAM_NOT_EXIST, OBJECT_NOT_EXIST, NODE_EPOCH_NOT_EXIST, KEY_NOT_EXIST -> NotFoundError;
STREAM_FENCED, NODE_EPOCH_EXPIRED, NODE_FENCED -> FencedError;
STREAM_NOT_CLOSED, STREAM_NOT_OPENED, OFFSET_NOT_MATCHED, COMPACTED_OBJECTS_NOT_FOUND,
OBJECT_NOT_COMMITTED, KEY_EXIST, KV_CONDITION_FAILED, STREAM_INNER_ERROR -> ConflictError;
bad arguments -> InvalidArgumentError. The cluster's (``cluster_ops``): NOT_OWNER -> NotOwnerError
(naming the owner); NODE_NOT_ALIVE -> NotFoundError; NODE_TAKEOVER_IN_PROGRESS -> UnavailableError
(``open_node``, ``open_stream``: retry) or ConflictError (``start_takeover``: one at a time).

Where we differ from (or pin down) AutoMQ: no failover mode, fast close or historical WAL
responsibility; the current range's end follows its owner's commits (AutoMQ lets it lag);
StreamSet ranges are kept in metadata (AutoMQ V2+ reads them from the object index);
``get_objects`` raises NotFoundError / OffsetOutOfRangeError where AutoMQ answers INVALID;
``mark_destroyed`` and ``remove_objects`` are idempotent lifecycle calls of ours (AutoMQ's
controller does both internally). Implementations: ``sqlite.SqliteMetadataStore`` (durable) and
``memory.MemoryMetadataStore``; both run the same controller (``stream_ops``, ``object_ops``,
``node_ops``, ``queries``), so they cannot disagree. Node sessions, leases and the fencing of bound
stores: ``node_ops`` and ``docs/decisions/0024-node-epochs-leases-and-fencing.md``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from s3stream.errors import S3StreamError
from s3stream.ids import NodeId, ObjectId, StreamId


class StreamState(enum.IntEnum):
    CLOSED = 0
    OPENED = 1


class ObjectState(enum.IntEnum):
    PREPARED = 1
    COMMITTED = 2
    MARK_DESTROYED = 3


class ObjectKind(enum.IntEnum):
    STREAM_SET = 0
    STREAM = 1


@dataclass(frozen=True, slots=True)
class RangeMetadata:
    """The interval ``[start_offset, end_offset)`` written by one owner under one epoch."""

    stream_id: StreamId
    epoch: int
    range_index: int
    start_offset: int
    end_offset: int
    node_id: NodeId


@dataclass(frozen=True, slots=True)
class StreamMetadata:
    stream_id: StreamId
    epoch: int
    """-1 until the first open."""
    state: StreamState
    start_offset: int
    end_offset: int
    ranges: tuple[RangeMetadata, ...] = ()
    tags: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class S3ObjectMetadata:
    object_id: ObjectId
    state: ObjectState
    size_bytes: int
    """0 while PREPARED."""
    prepared_at_ms: int
    expires_at_ms: int
    """Deadline of a PREPARED object; after it the object is marked destroyed."""
    committed_at_ms: int = -1
    marked_at_ms: int = -1
    """When it became MARK_DESTROYED (-1 otherwise)."""
    kind: ObjectKind | None = None
    """Known once committed."""


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """A node's current session: the epoch the database issued it and its lease.

    ``lease_expires_at_ms == -1``: an unleased session (registered by ``register_node`` with an
    epoch of its own), valid for as long as its epoch is the current one. Otherwise the session is
    valid while the store's clock is below ``lease_expires_at_ms``. Times are the store's clock in
    ms; -1 means "never".
    """

    node_id: NodeId
    node_epoch: int
    lease_expires_at_ms: int
    heartbeat_at_ms: int
    registered_at_ms: int


@dataclass(frozen=True, slots=True)
class LeaseInfo:
    """A named lease and the node session holding it until ``expires_at_ms`` (the store's clock)."""

    name: str
    node_id: NodeId
    node_epoch: int
    expires_at_ms: int


class TakeoverState(enum.IntEnum):
    """Where the takeover of a dead node stands (``docs/architecture.md``, cluster metadata)."""

    PENDING = 0
    """Fenced; no live taker assigned (there was no live node to take it)."""
    RUNNING = 1
    """Assigned to ``taker_node_id`` / ``taker_node_epoch``."""
    DONE = 2
    FAILED = 3
    """Given up after ``s3.wal.failover.attempts.max`` attempts: the slot is free, the taken streams
    were handed back to the dead node, which may register again and replay its own WAL."""


@dataclass(frozen=True, slots=True)
class TakeoverInfo:
    """The takeover of a dead node's streams and WAL: one row per dead node (the in-flight one, or
    the last DONE). At most one row cluster-wide is PENDING or RUNNING."""

    node_id: NodeId
    """The dead node."""
    node_epoch: int
    """Its lapsed session's epoch."""
    fence_epoch: int
    """The node epoch written to fence it (``node_epoch + 1``)."""
    wal_path: str
    """The dead node's WAL as its ``open_node`` recorded it ("" unknown)."""
    streams: tuple[tuple[StreamId, int], ...]
    """(stream id, the dead node's stream epoch) of every stream it held OPENED at the fence."""
    state: TakeoverState
    taker_node_id: int
    """-1: none."""
    taker_node_epoch: int
    """-1: none."""
    attempt: int
    """Takers assigned so far (1 for the first; 0 while none ever was)."""
    created_at_ms: int
    updated_at_ms: int
    """The last change or progress report (the controller's no-progress deadline counts from it)."""
    wal_end_offset: int = -1
    """DONE: one past the last WAL record the taker replayed (-1 unknown)."""


@dataclass(frozen=True, slots=True)
class Assignment:
    """A requested move of a stream to ``to_node_id`` (one row per stream; a later request
    overwrites it). Removed by the open that completes the move."""

    stream_id: StreamId
    to_node_id: NodeId
    from_node_id: int
    """The owner when requested; -1: the stream was not open anywhere."""
    requested_at_ms: int


@dataclass(frozen=True, slots=True)
class StreamOutcome:
    """One stream's result in a batched open or close (``open_streams``, ``close_streams``):
    exactly one of success (``error`` None; ``stream`` the opened stream's metadata, None for a
    close) and refusal (``error`` the typed error the single-stream call would have raised; that
    stream wrote nothing)."""

    stream_id: StreamId
    stream: StreamMetadata | None
    error: S3StreamError | None


@dataclass(frozen=True, slots=True)
class NodeRuntime:
    """What a node reports of itself besides its session: its WAL's path and un-uploaded bytes."""

    node_id: NodeId
    wal_path: str
    """"" unknown."""
    wal_pending_bytes: int
    """Un-uploaded WAL bytes at the last heartbeat; -1 unknown."""
    updated_at_ms: int


@dataclass(frozen=True, slots=True)
class StreamOffsetRange:
    """One stream's ``[start_offset, end_offset)`` inside an object, with its payload bytes."""

    stream_id: StreamId
    start_offset: int
    end_offset: int
    size_bytes: int = 0


@dataclass(frozen=True, slots=True)
class StreamSetObject:
    object_id: ObjectId
    node_id: NodeId
    order_id: int
    data_time_ms: int
    size_bytes: int
    ranges: tuple[StreamOffsetRange, ...]
    """Sorted by stream id."""


@dataclass(frozen=True, slots=True)
class StreamObject:
    object_id: ObjectId
    stream_id: StreamId
    start_offset: int
    end_offset: int
    size_bytes: int
    data_time_ms: int = -1


@dataclass(frozen=True, slots=True)
class NewStreamObject:
    """A stream object named in a commit request."""

    object_id: ObjectId
    stream_id: StreamId
    start_offset: int
    end_offset: int
    size_bytes: int


@dataclass(frozen=True, slots=True)
class CommitStreamSetObjectRequest:
    """AutoMQ's CommitStreamSetObjectRequest. ``object_id == -1``: no StreamSet object."""

    node_id: NodeId
    node_epoch: int
    object_id: ObjectId
    order_id: int
    object_size_bytes: int
    stream_ranges: tuple[StreamOffsetRange, ...]
    stream_objects: tuple[NewStreamObject, ...] = ()
    compacted_object_ids: tuple[ObjectId, ...] = ()
    """Non-empty for a compaction: no continuity check, no end-offset advance."""


@dataclass(frozen=True, slots=True)
class CommitStreamObjectRequest:
    """AutoMQ's CommitStreamObjectRequest (stream object compaction). ``stream_epoch == -1`` skips
    the ownership check; ``object_id == -1`` only destroys the sources."""

    object_id: ObjectId
    object_size_bytes: int
    stream_id: StreamId
    stream_epoch: int
    start_offset: int
    end_offset: int
    source_object_ids: tuple[ObjectId, ...]
    node_id: NodeId = 0  # type: ignore[assignment]
    node_epoch: int = 0


@dataclass(frozen=True, slots=True)
class ObjectSlice:
    """One object's part of a stream, as returned by :meth:`MetadataStore.get_objects`."""

    object_id: ObjectId
    kind: ObjectKind
    size_bytes: int
    stream_id: StreamId
    start_offset: int
    end_offset: int


@dataclass(frozen=True, slots=True)
class KvWrite:
    """One KV change of :meth:`MetadataStore.kv_apply`: a put (``value``; ``overwrite`` false keeps an
    existing value) or, with ``value`` None, a delete."""

    key: str
    value: bytes | None
    overwrite: bool = True


@dataclass(frozen=True, slots=True)
class CommittedObject:
    """One prepared object of a :class:`CommitObjectsRequest`: a StreamSet object (``ranges`` sorted by
    stream id, one per stream) or, with ``stream_object``, a stream object (exactly one range)."""

    object_id: ObjectId
    object_size: int
    ranges: tuple[StreamOffsetRange, ...]
    stream_object: bool = False


@dataclass(frozen=True, slots=True)
class CommitObjectsRequest:
    """An external commit (objects written outside the WAL, e.g. by Spark executors): see
    :meth:`MetadataStore.commit_objects`.

    ``stream_epochs``: the epoch each stream named by a range must have now (other streams listed are
    checked too). ``kv_expect``: key -> the value it must hold now (None: absent). ``release_ids``:
    PREPARED ids to mark destroyed (the objects of losing attempts)."""

    node_id: NodeId
    node_epoch: int
    objects: tuple[CommittedObject, ...]
    stream_epochs: Mapping[StreamId, int]
    kv_puts: Mapping[str, bytes] = field(default_factory=dict)
    kv_expect: Mapping[str, bytes | None] = field(default_factory=dict)
    release_ids: tuple[ObjectId, ...] = ()


class MetadataStore(Protocol):
    """Transactional metadata: every method is one atomic operation."""

    # -- nodes and streams ------------------------------------------------------------------
    async def register_node(self, *, node_id: NodeId, node_epoch: int) -> list[StreamMetadata]:
        """(Re-)register a node (AutoMQ getOpeningStreams): returns the OPENED streams whose current
        range it owns. A lower epoch than the stored one -> FencedError(NODE_EPOCH_EXPIRED)."""
        ...

    async def open_node(self, *, node_id: NodeId, lease_ms: int, wal_path: str = "") -> NodeInfo:
        """Register or re-register a node: its epoch becomes the stored one + 1 (1 for a new node),
        which fences every older session of the node; its lease expires ``lease_ms`` from now.
        ``wal_path`` is recorded in its node runtime. While a takeover of the node is PENDING or
        RUNNING -> UnavailableError(NODE_TAKEOVER_IN_PROGRESS), nothing written."""
        ...

    async def heartbeat(
        self, *, node_id: NodeId, node_epoch: int, lease_ms: int, wal_pending_bytes: int = -1
    ) -> NodeInfo:
        """Renew the session's lease to ``lease_ms`` from now (and record ``wal_pending_bytes`` in its
        node runtime). A session whose epoch is not the current one, or whose lease has expired,
        -> FencedError(NODE_FENCED): an expired lease is never revived (open the node again); an
        unknown node has no session: the same error."""
        ...

    async def close_node(self, *, node_id: NodeId, node_epoch: int) -> None:
        """End the session now (its lease expires, its leases are released); a no-op for a session
        that is already fenced or of an unknown node."""
        ...

    async def list_nodes(self) -> list[NodeInfo]:
        """Every registered node, by id."""
        ...

    async def acquire_lease(self, *, name: str, node_id: NodeId, node_epoch: int, lease_ms: int) -> LeaseInfo:
        """Take the named lease if it is free, expired, or held by a fenced session; renew it if this
        session holds it (to ``lease_ms`` from now). Returns the holder after the call: the caller holds
        the lease iff the holder is ``(node_id, node_epoch)``. The session itself must be valid (else
        FencedError(NODE_FENCED))."""
        ...

    async def release_lease(self, *, name: str, node_id: NodeId, node_epoch: int) -> None:
        """Give the lease up if this session holds it; otherwise a no-op."""
        ...

    async def get_lease(self, name: str) -> LeaseInfo | None:
        """The valid holder of the lease at the store's clock; None when it is free, expired or held
        by a fenced session."""
        ...

    async def create_stream(
        self, *, node_id: NodeId, node_epoch: int, tags: Mapping[str, str] | None = None
    ) -> StreamId:
        """A new CLOSED stream (epoch -1, offsets 0); ids count up from 0."""
        ...

    async def open_stream(
        self, *, node_id: NodeId, node_epoch: int, stream_id: StreamId, epoch: int
    ) -> StreamMetadata:
        """Lower epoch -> FencedError(STREAM_FENCED); same epoch: a retry (reopens a CLOSED stream,
        owner must match); higher epoch while OPENED -> ConflictError(STREAM_NOT_CLOSED), else a new
        range ``[end, end)`` owned by ``node_id`` and the previous range sealed at the end offset.
        Cluster rules: OPENED by another node -> NotOwnerError(owner) while its session is valid,
        UnavailableError(NODE_TAKEOVER_IN_PROGRESS) once it lapsed; an open that makes a CLOSED stream
        OPENED is refused with NotOwnerError(target) when its assignment row names another node with a
        valid session, and otherwise removes the row."""
        ...

    async def close_stream(
        self, *, node_id: NodeId, node_epoch: int, stream_id: StreamId, epoch: int
    ) -> None:
        """Ownership checked (docs/automq-model.md section 7); closing a CLOSED stream is a no-op. The caller
        uploads its data first."""
        ...

    async def open_streams(
        self, *, node_id: NodeId, node_epoch: int, requests: Sequence[tuple[StreamId, int]]
    ) -> list[StreamOutcome]:
        """``open_stream`` of each ``(stream_id, epoch)`` (distinct streams) in one transaction, one
        outcome per request in order: a stream refused keeps its state, the others open. The whole
        call raises, writing nothing, for bad arguments or a fenced node session."""
        ...

    async def close_streams(
        self, *, node_id: NodeId, node_epoch: int, requests: Sequence[tuple[StreamId, int]]
    ) -> list[StreamOutcome]:
        """``close_stream`` of each ``(stream_id, epoch)`` in one transaction; outcomes as
        :meth:`open_streams`. The caller uploads the streams' data first."""
        ...

    async def trim_stream(
        self, *, node_id: NodeId, node_epoch: int, stream_id: StreamId, epoch: int, new_start_offset: int
    ) -> None:
        """Move the start offset up (never down: OFFSET_NOT_MATCHED); past the end moves the end too.
        Objects are not touched: compaction drops the data below the start later."""
        ...

    async def delete_stream(self, *, stream_id: StreamId, epoch: int) -> None:
        """Forget a CLOSED stream (else STREAM_NOT_CLOSED) and mark its stream objects destroyed; its
        data in StreamSet objects stays for compaction. A missing stream is a no-op; ``epoch`` is
        not checked (AutoMQ's topic cleanup passes Long.MAX)."""
        ...

    async def describe_stream(self, stream_id: StreamId) -> StreamMetadata: ...

    async def list_streams(self) -> list[StreamMetadata]: ...

    # -- objects ----------------------------------------------------------------------------
    async def prepare_objects(self, *, count: int, ttl_ms: int) -> ObjectId:
        """Allocate ``count`` consecutive PREPARED object ids; returns the first."""
        ...

    async def next_object_id(self) -> ObjectId:
        """The object id counter: the id the next :meth:`prepare_objects` hands out (0 before the
        first). Read only. Every id metadata ever issued is below it, and it never goes down."""
        ...

    async def commit_stream_set_object(self, request: CommitStreamSetObjectRequest) -> None:
        """Commit a WAL upload (continuity checked, end offsets advanced) or a compaction
        (``compacted_object_ids``: sources marked destroyed, no continuity check, order id -1 -> the
        smallest source order id, data time = the smallest source data time). Committing a COMMITTED
        object again is a no-op; a stream object of a deleted stream is marked destroyed at once.
        All or nothing."""
        ...

    async def commit_objects(self, request: CommitObjectsRequest) -> None:
        """Commit prepared objects written outside the WAL, in ONE transaction, all or nothing: each
        stream's ranges, in request order, tile ``[end offset, new end offset)`` (else
        OFFSET_NOT_MATCHED); every stream named is OPENED (STREAM_NOT_OPENED), at the request's epoch
        (lower stored: STREAM_INNER_ERROR, higher: STREAM_FENCED) and its last range owned by the
        node (STREAM_FENCED); StreamSet objects get order ids at commit, in request order, above
        every order id issued before, so they order after every StreamSet object committed earlier;
        ``kv_expect`` must hold (else ConflictError(KV_CONDITION_FAILED)), then ``kv_puts`` are
        written and ``release_ids`` marked destroyed (a COMMITTED one: ConflictError; a missing one
        is skipped). A retry of a commit that happened (every object COMMITTED and every put key
        holding its value) is a no-op."""
        ...

    async def commit_stream_object(self, request: CommitStreamObjectRequest) -> None:
        """Stream-object compaction: commit ``object_id`` (unless -1), mark the sources destroyed
        (missing or already marked -> COMPACTED_OBJECTS_NOT_FOUND); raises the end offset if the new
        object ends beyond it. All or nothing."""
        ...

    async def get_objects(
        self, *, stream_id: StreamId, start_offset: int, end_offset: int, limit: int
    ) -> list[ObjectSlice]:
        """Contiguous slices covering the stream from the object containing ``start_offset``
        (``end_offset == -1``: unbounded), at most ``limit`` of them; each slice carries the whole
        object's size. Stops early at a gap. Missing stream -> NotFoundError; ``start_offset`` below
        the stream start -> OffsetOutOfRangeError."""
        ...

    async def get_stream_set_objects(self, node_id: NodeId) -> list[StreamSetObject]:
        """The node's StreamSet objects in order-id order."""
        ...

    async def get_stream_objects(
        self, *, stream_id: StreamId, start_offset: int, end_offset: int, limit: int
    ) -> list[StreamObject]: ...

    async def get_object(self, object_id: ObjectId) -> S3ObjectMetadata: ...

    async def list_objects(self, states: Sequence[ObjectState] | None = None) -> list[S3ObjectMetadata]: ...

    async def expire_prepared(self, *, now_ms: int) -> list[ObjectId]:
        """Mark PREPARED objects past their deadline MARK_DESTROYED; returns their ids."""
        ...

    async def mark_destroyed(self, object_ids: Sequence[ObjectId], *, now_ms: int) -> None:
        """Mark objects destroyed and drop them from the StreamSet / stream-object indexes. Every id
        must exist (else NotFoundError, nothing written); already marked ones stay unchanged."""
        ...

    async def destroyable_objects(self, *, marked_before_ms: int, limit: int) -> list[S3ObjectMetadata]:
        """MARK_DESTROYED objects marked before the cutoff (ready for physical delete)."""
        ...

    async def remove_objects(self, object_ids: Sequence[ObjectId]) -> None:
        """Forget objects whose bytes were deleted from the bucket. Ids already gone are skipped; a
        live (not MARK_DESTROYED) object -> ConflictError, nothing written."""
        ...

    # -- KV ---------------------------------------------------------------------------------
    async def kv_put(self, key: str, value: bytes, *, overwrite: bool = True) -> bytes:
        """Returns the value now stored (the existing one if ``overwrite`` is false and the key exists)."""
        ...

    async def kv_get(self, key: str) -> bytes | None: ...

    async def kv_delete(self, key: str) -> bytes | None: ...

    async def kv_apply(
        self, writes: Sequence[KvWrite], *, node_id: NodeId, wal_offset: int
    ) -> list[bytes | None]:
        """Apply ``writes`` in order and record ``wal_offset`` as ``node_id``'s applied KV WAL offset,
        all in one transaction. Returns per write what kv_put / kv_delete would (the value stored, or
        the deleted one). ``wal_offset`` -1 with no writes resets the record (a new WAL)."""
        ...

    async def kv_applied_offset(self, node_id: NodeId) -> int:
        """The WAL offset of ``node_id``'s last KV record applied through :meth:`kv_apply`; -1 if none."""
        ...

    # -- cluster: node runtime, assignments, takeovers (s3stream.metadata.cluster_ops) ---------
    async def list_node_runtime(self) -> list[NodeRuntime]:
        """Every node's runtime row, by node id."""
        ...

    async def request_reassign(
        self, *, stream_ids: Sequence[StreamId], to_node_id: NodeId
    ) -> list[Assignment]:
        """Request that the streams move to ``to_node_id``, in one transaction: one assignment row
        per stream (overwriting an earlier one). A stream already OPENED by ``to_node_id`` gets none
        (and loses an older row); the rows written are returned. Unknown stream ->
        NotFoundError(STREAM_NOT_EXIST); ``to_node_id`` without a valid session ->
        NotFoundError(NODE_NOT_ALIVE). Unguarded: any process may request."""
        ...

    async def list_assignments(self) -> list[Assignment]:
        """Every assignment row, by stream id."""
        ...

    async def start_takeover(
        self, *, node_id: NodeId, node_epoch: int, taker_node_id: int, taker_node_epoch: int
    ) -> TakeoverInfo:
        """The controller's one transaction: fence the lapsed session ``(node_id, node_epoch)`` (node
        epoch + 1, lease expired), snapshot its OPENED streams, drop the assignments targeting it,
        and hand the takeover to the taker (RUNNING; ``taker_node_id`` -1: PENDING). A node owning no
        OPENED stream gets a DONE row at once. ConflictError unless ``node_epoch`` is the node's
        current epoch and its lease lapsed, or while another takeover is PENDING/RUNNING;
        NotFoundError(NODE_NOT_ALIVE) when the taker has no valid session."""
        ...

    async def reassign_takeover(
        self, *, node_id: NodeId, taker_node_id: NodeId, taker_node_epoch: int
    ) -> TakeoverInfo:
        """Give the in-flight takeover of ``node_id`` a new (valid) taker: attempt + 1, RUNNING."""
        ...

    async def list_takeovers(self) -> list[TakeoverInfo]:
        """Every takeover row (in flight, and the last DONE per node), by node id."""
        ...

    async def takeover_streams(
        self, *, node_id: NodeId, taker_node_id: NodeId, taker_node_epoch: int
    ) -> list[tuple[StreamMetadata, int]]:
        """The taker takes every snapshot stream still OPENED: each is opened as the taker at its
        stored epoch + 1 with a new range at its end offset (unless its last range is already the
        taker's from this takeover). Returns (stream after, the dead node's stream epoch), by stream
        id. ConflictError unless the takeover of ``node_id`` is RUNNING with this taker."""
        ...

    async def finish_takeover(
        self, *, node_id: NodeId, taker_node_id: NodeId, taker_node_epoch: int, wal_end_offset: int
    ) -> TakeoverInfo:
        """Mark the takeover DONE and close every snapshot stream whose last range is the taker's;
        the dead node's applied KV WAL offset becomes at least ``wal_end_offset - 1`` (what the taker
        read is applied; a record above it was never acknowledged). ConflictError unless it is
        RUNNING with this taker."""
        ...

    # -- assignments that cannot finish (s3stream.metadata.cluster_ops; decision 0046) ---------------
    async def settle_assignment(self, *, stream_id: StreamId, node_id: NodeId, node_epoch: int) -> bool:
        """Remove the stream's assignment row if it targets ``node_id`` and that node owns the stream
        (OPENED): a request sent it back before its owner let it go. Returns whether a row went.
        FencedError unless the session is valid."""
        ...

    async def redirect_assignments(
        self, *, stream_ids: Sequence[StreamId], to_node_id: NodeId
    ) -> list[Assignment]:
        """Rewrite each named assignment row whose target has no valid session (checked in this
        transaction) to target ``to_node_id`` (which must have one, else NotFoundError
        NODE_NOT_ALIVE); returns the rows written."""
        ...

    # -- takeover attempts that fail (s3stream.metadata.cluster_ops; decision 0045) ------------------
    async def report_takeover_progress(
        self, *, node_id: NodeId, taker_node_id: NodeId, taker_node_epoch: int
    ) -> TakeoverInfo:
        """The taker made progress: ``updated_at_ms`` becomes now (the controller re-assigns an
        attempt with no progress for ``s3.wal.failover.progress.leases`` leases). ConflictError
        unless the takeover is RUNNING with this taker."""
        ...

    async def give_back_takeover(
        self, *, node_id: NodeId, taker_node_id: NodeId, taker_node_epoch: int
    ) -> TakeoverInfo:
        """The taker gives its attempt up (it failed ``s3.wal.failover.run.failures.max`` times):
        PENDING without a taker, attempt kept; the controller assigns the next attempt. ConflictError
        unless the takeover is RUNNING with this taker."""
        ...

    async def fail_takeover(self, *, node_id: NodeId) -> TakeoverInfo:
        """Give the in-flight takeover of ``node_id`` up: FAILED (the one in-flight slot is free).
        Every snapshot stream a taker took and still holds OPENED is handed back to the dead node
        (a new range of the dead node at the stream's epoch + 1), so the dead node's next session
        replays them from its own WAL. ConflictError when no takeover of it is in flight."""
        ...

    # -- object placement over several buckets (schema version 6) --------------------------------
    async def record_placement(self, object_id: ObjectId, bucket_ids: Sequence[int]) -> None:
        """Record that the buckets ``bucket_ids`` hold object ``object_id`` (which must exist, in any
        state: NotFoundError otherwise). Adds rows only; idempotent. The rows leave with the object."""
        ...

    async def placements(self, object_ids: Sequence[ObjectId]) -> dict[ObjectId, tuple[int, ...]]:
        """The recorded bucket ids (ascending) of each given object that has rows; an object missing
        from the result lives in the data dir's first bucket."""
        ...

    async def bucket_usage(self, *, unplaced_bucket_id: int = 0) -> dict[int, tuple[int, int]]:
        """``{bucket id: (objects, bytes)}`` over COMMITTED objects; objects without rows count for
        ``unplaced_bucket_id`` (the data dir's first bucket), replicated ones for each bucket."""
        ...

    async def close(self) -> None: ...
