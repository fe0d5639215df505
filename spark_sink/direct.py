"""The direct path of :class:`~spark_sink.sink.S3StreamSink`: executors write objects, the driver commits.

Per micro-batch (``docs/spark-sink.md`` section "Direct writes"):

1. settle: streams an earlier commit of this writer left reserved with an unknown outcome take the
   metadata's ends (``SyncClient.settle_external``); skip: (query, topic)'s direct progress record
   names this batch or a later one, or the driver path's record names it complete -> nothing to do
   (a replay of a committed batch);
2. check: every partition's stream ends at the topic's committed end (else a foreign or unfinished
   write sits past it: ``ConflictError``, nothing written);
3. persist the normalized rows with their row hashes; **count pass**, a Spark aggregation
   (:func:`~spark_sink.direct_count.count_pass`: one small row per task and partition with its row
   digest, no row enters Python); plan every task's absolute base offsets
   (:func:`~spark_sink.direct_protocol.plan_bases`);
4. prepare ``tasks x SLOTS_PER_TASK`` object ids (in calls of at most ``PREPARE_IDS_PER_CALL_MAX``);
   **write pass**: each task attempt encodes its rows with absolute offsets, checks its counts and
   row digests against the count pass's and uploads one object under its slot's id, returning a
   description (each task reads only its own assignment, from one broadcast of the plan);
5. check the descriptions tile every partition's range (:func:`~spark_sink.direct_protocol.check_tiling`)
   and the ids' TTL (``s3.direct.prepared.ttl.ms``) has not run out; commit every object, the stream
   ends, the progress record and the committed record in ONE ``commit_objects`` transaction,
   conditional on both records still holding what step 1 read, releasing the other prepared ids (as
   many as one commit takes; the rest in bounded calls after it, :mod:`spark_sink.direct_ids`);
   unpersist.

The engine's ``commit_external`` reserves the topic's streams, waits for the appends in flight, uploads
whatever the WAL holds of them and checks their ends before the transaction: data the driver appended
through the WAL is never overtaken. The driver handles only O(tasks x partitions) values.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from s3stream.errors import ConflictError, ErrorCode, InvalidArgumentError, NotFoundError, UnavailableError
from s3stream.facade import SyncClient, SyncStream
from s3stream.ids import ObjectId, StreamId
from s3stream.metadata.base import CommittedObject, StreamOffsetRange
from spark_sink.direct_count import count_pass, with_digest
from spark_sink.direct_ids import PreparedDeadline, check_commit_size, expired_error, split_release
from spark_sink.direct_protocol import (
    DirectProgress,
    ObjectDescription,
    OffsetPlan,
    SlotTable,
    TaskAssignment,
    TaskCount,
    WrittenRange,
    check_tiling,
    committed_after_direct,
    direct_committed_key,
    direct_progress_key,
    load_committed,
    plan_bases,
    prepare_call_sizes,
    task_assignments,
)
from spark_sink.direct_tasks import (
    WRITE_DDL,
    DirectOptions,
    SharedValue,
    TaskObserver,
    WriteFunction,
    no_task_observer,
)
from spark_sink.encode import EncodeOptions
from spark_sink.protocol import Committed, committed_key, load_progress

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

T = TypeVar("T")
log = logging.getLogger(__name__)
PERSIST_LEVEL_DEFAULT = "MEMORY_AND_DISK"
"""How the micro-batch is kept between the count pass and the write pass (a ``StorageLevel`` name)."""
PERSIST_LEVELS = ("MEMORY_AND_DISK", "MEMORY_AND_DISK_SER", "DISK_ONLY", "MEMORY_ONLY")


@dataclass(frozen=True, slots=True)
class _Snapshot:
    """The KV records a direct commit reads and expects unchanged (None: absent), and the committed
    record they give."""

    raw: dict[str, bytes | None]
    committed: Committed


@dataclass(frozen=True, slots=True)
class DirectStats:
    """What one direct micro-batch did."""

    batch_id: int
    rows: int
    tasks: int
    objects: int
    stream_objects: int
    bytes_written: int
    skipped: bool
    count_s: float
    write_s: float
    commit_s: float


def _run(client: SyncClient, coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run_coroutine_threadsafe(coro, client.loop).result()


class DirectWriter:
    """Runs micro-batches on the direct path for one sink (its client, topic and streams)."""

    def __init__(
        self,
        *,
        client: SyncClient,
        topic: str,
        streams: list[SyncStream],
        bucket_uri: str,
        namespace: str,
        prepared_ttl_ms: int,
        observer: Callable[[str], None],
        task_observer: TaskObserver | None = None,
        persist_level: str = PERSIST_LEVEL_DEFAULT,
    ) -> None:
        self.client = client
        self.topic = topic
        self.streams = streams
        self.bucket_uri = bucket_uri
        self.namespace = namespace
        self.prepared_ttl_ms = prepared_ttl_ms
        """TTL of the ids :meth:`_prepare` takes (``s3.direct.prepared.ttl.ms``): the longest the
        write pass may take."""
        self._deadline: PreparedDeadline | None = None
        """Set by :meth:`_prepare`, checked by :meth:`_commit` (one micro-batch at a time)."""
        self.observer = observer
        self.task_observer = task_observer
        self.persist_level = persist_level

    def _kv_get(self, key: str) -> bytes | None:
        return kv_get(self.client, key)

    def snapshot(self, query_id: str) -> _Snapshot:
        """The records the commit is conditional on, read once before anything is planned."""
        keys = (
            direct_progress_key(query_id, self.topic),
            direct_committed_key(self.topic),
            committed_key(self.topic),
        )
        raw = {k: self._kv_get(k) for k in keys}
        committed = load_committed(raw.__getitem__, self.topic, len(self.streams))
        return _Snapshot(raw, committed)

    def already_committed(self, query_id: str, batch_id: int, snap: _Snapshot) -> bool:
        """True when micro-batch ``batch_id`` of ``query_id`` is committed on either path."""
        key = direct_progress_key(query_id, self.topic)
        raw = snap.raw[key]
        if raw is not None and DirectProgress.decode(raw, key=key).batch_id >= batch_id:
            return True
        wal_progress = load_progress(self._kv_get, query_id, self.topic, snap.committed)
        if wal_progress is None:
            return False
        return wal_progress.batch_id > batch_id or (
            wal_progress.batch_id == batch_id and wal_progress.complete
        )

    def check_ends(self, committed: Committed, batch_id: int) -> None:
        for p, (stream, want) in enumerate(zip(self.streams, committed.ends, strict=True)):
            got = stream.next_offset
            if got != want:
                raise ConflictError(
                    f"micro-batch {batch_id}: partition {p} of topic {self.topic!r} ends at offset {got}, "
                    f"its committed end is {want}: another writer appended to the topic, or a micro-batch "
                    "of the driver path is unfinished; nothing of this micro-batch was written"
                )

    def write(self, rows: DataFrame, encode: EncodeOptions, *, query_id: str) -> DirectStats:
        """Write the normalized ``rows`` of micro-batch ``encode.batch_id`` (see the module docstring)."""
        batch_id = encode.batch_id
        t0 = time.perf_counter()
        self.settle()
        snap = self.snapshot(query_id)
        committed = snap.committed
        if self.already_committed(query_id, batch_id, snap):
            self.observer(f"skip:{batch_id}")
            return DirectStats(batch_id, 0, 0, 0, 0, 0, True, 0.0, 0.0, 0.0)
        self.check_ends(committed, batch_id)
        persisted = self._persist(rows)
        try:
            counts = self._count(persisted, encode)
            plan = plan_bases(counts, committed.ends)
            self.observer(f"after_count:{batch_id}")
            t1 = time.perf_counter()
            if not plan.tasks:
                self.observer(f"after_batch:{batch_id}")
                return DirectStats(batch_id, 0, 0, 0, 0, 0, False, t1 - t0, 0.0, 0.0)
            slots = self._prepare(plan, batch_id=batch_id)
            self.observer(f"after_prepare:{batch_id}")
            described = self._write_objects(persisted, encode, plan, slots)
            self.observer(f"after_upload:{batch_id}")
            t2 = time.perf_counter()
            winners = check_tiling(plan, slots, described)
            self.observer(f"before_commit:{batch_id}")
            self._commit(snap, plan, slots, winners, query_id=query_id, batch_id=batch_id)
            self.observer(f"after_batch:{batch_id}")
            t3 = time.perf_counter()
        finally:
            persisted.unpersist()
        return DirectStats(
            batch_id=batch_id,
            rows=plan.record_count,
            tasks=len(plan.tasks),
            objects=len(winners),
            stream_objects=sum(1 for w in winners if w.stream_object),
            bytes_written=sum(w.size_bytes for w in winners),
            skipped=False,
            count_s=t1 - t0,
            write_s=t2 - t1,
            commit_s=t3 - t2,
        )

    def _persist(self, rows: DataFrame) -> DataFrame:
        """The normalized ``rows`` with their row hashes (:func:`with_digest`), persisted at
        ``persist_level`` for both passes."""
        from pyspark import StorageLevel

        return with_digest(rows).persist(getattr(StorageLevel, self.persist_level))

    def _count(self, rows: DataFrame, encode: EncodeOptions) -> list[TaskCount]:
        """The count pass over the persisted ``rows`` (:func:`count_pass`)."""
        return count_pass(rows, encode)

    def settle(self) -> int:
        """Settle this writer's streams if a commit with an unknown outcome left them reserved: they
        take the metadata's ends, so the progress record read next decides whether the batch is
        committed and :meth:`check_ends` compares the right offsets. Returns how many were settled."""
        settled = self.client.settle_external(self.streams)
        if settled:
            self.observer("settled")
        return settled

    def _prepare(self, plan: OffsetPlan, *, batch_id: int) -> SlotTable:
        """The ids of every task's slots, in bounded ``prepare_objects`` calls; starts the TTL clock."""
        check_commit_size(plan, batch_id=batch_id)
        tasks = plan.tasks
        self._deadline = PreparedDeadline(self.prepared_ttl_ms)
        firsts = [
            int(self.client.prepare_objects(count, ttl_ms=self.prepared_ttl_ms))
            for count in prepare_call_sizes(len(tasks))
        ]
        return SlotTable(firsts[0], tasks, later_first_ids=tuple(firsts[1:]))

    def _write_objects(
        self, rows: DataFrame, encode: EncodeOptions, plan: OffsetPlan, slots: SlotTable
    ) -> list[ObjectDescription]:
        # one broadcast: each Python worker loads the plan once, each task looks up its own entry
        shared = rows.sparkSession.sparkContext.broadcast(task_assignments(plan, slots))
        options = self._options(encode, slots, shared)
        try:
            collected = rows.mapInArrow(WriteFunction(options), WRITE_DDL).collect()
        finally:
            shared.unpersist()
        return [describe(row.asDict()) for row in collected]

    def _options(
        self, encode: EncodeOptions, slots: SlotTable, assignments: Mapping[int, TaskAssignment] | SharedValue
    ) -> DirectOptions:
        """What the write pass's tasks are given: ``assignments`` is :func:`task_assignments` of the
        plan, or a broadcast of it."""
        return DirectOptions(
            encode=encode,
            bucket_uri=self.bucket_uri,
            namespace=self.namespace,
            stream_ids=tuple(int(s.stream_id) for s in self.streams),
            stream_epochs=tuple(s.stream.epoch for s in self.streams),
            assignments=assignments,
            slots_per_task=slots.slots_per_task,
            task_observer=self.task_observer or no_task_observer,
        )

    def _commit(
        self,
        snap: _Snapshot,
        plan: OffsetPlan,
        slots: SlotTable,
        winners: list[ObjectDescription],
        *,
        query_id: str,
        batch_id: int,
    ) -> None:
        """ONE ``commit_objects``: the winners in task order, the stream ends, the progress and
        committed records (conditional on what :meth:`snapshot` read), the other slots' ids released
        (as many as the commit takes, the rest after it: :func:`split_release`). Refused before the
        store is asked when the ids' TTL has run out (:class:`PreparedDeadline`)."""
        stream_ids = [StreamId(int(s.stream_id)) for s in self.streams]
        objects = [
            CommittedObject(
                ObjectId(w.object_id),
                w.size_bytes,
                tuple(
                    sorted(
                        (
                            StreamOffsetRange(
                                stream_ids[r.partition], r.start_offset, r.end_offset, r.size_bytes
                            )
                            for r in w.ranges
                        ),
                        key=lambda r: r.stream_id,
                    )
                ),
                w.stream_object,
            )
            for w in winners
        ]
        used = {w.object_id for w in winners}
        progress_key = direct_progress_key(query_id, self.topic)
        new_committed = committed_after_direct(snap.committed, plan, query_id=query_id, batch_id=batch_id)
        unused = [ObjectId(i) for i in slots.all_ids() if i not in used]
        release_now, release_later = split_release(unused, range_count=sum(len(o.ranges) for o in objects))
        deadline = self._deadline
        assert deadline is not None, "_prepare runs before _commit"
        deadline.check(batch_id=batch_id)
        try:
            self.client.commit_objects(
                self.streams,
                objects,
                kv_puts={
                    progress_key: DirectProgress(batch_id).encode(),
                    direct_committed_key(self.topic): new_committed.encode(),
                },
                # not the driver path's record (a WAL key): it moves only by an abandon, which needs
                # records past the committed ends, and the continuity check refuses any such record
                kv_expect={k: v for k, v in snap.raw.items() if k != committed_key(self.topic)},
                release_ids=release_now,
            )
        except NotFoundError as exc:
            if exc.code != ErrorCode.OBJECT_NOT_EXIST:
                raise
            # expired by the store's clock, just inside the driver's
            raise expired_error(
                batch_id, deadline.ttl_ms, f"an object id was gone at the commit ({exc})"
            ) from exc
        self._release(release_later, batch_id=batch_id)

    def _release(self, chunks: list[list[ObjectId]], *, batch_id: int) -> None:
        """Release the unused ids the commit had no room for, one bounded call per chunk. The batch is
        committed already: a store that fails here only leaves ids to expire after their TTL."""
        for i, chunk in enumerate(chunks):
            try:
                self.client.commit_objects([], [], release_ids=chunk)
            except UnavailableError as exc:
                left = sum(len(c) for c in chunks[i:])
                log.warning(
                    "micro-batch %d is committed; releasing %d unused object ids failed (%s): they expire "
                    "after s3.direct.prepared.ttl.ms",
                    batch_id,
                    left,
                    exc,
                )
                return


def describe(row: Mapping[str, Any]) -> ObjectDescription:
    """The description of one row of the write pass (:data:`WRITE_DDL`); an error row raises its
    error as ConflictError."""
    if row["error"] is not None:
        raise ConflictError(str(row["error"]))
    ranges = tuple(WrittenRange(int(p), int(s), int(e), int(b)) for p, s, e, b in json.loads(row["ranges"]))
    return ObjectDescription(
        row["task"], row["slot"], row["object_id"], row["size_bytes"], row["stream_object"], ranges
    )


def kv_get(client: SyncClient, key: str) -> bytes | None:
    """A KV value read from the metadata store (direct-path keys are not the engine KV client's)."""
    return _run(client, client.client.engine.metadata.kv_get(key))


def direct_batch_committed(client: SyncClient, query_id: str, topic: str, batch_id: int) -> bool:
    """Whether the direct path committed micro-batch ``batch_id`` (or a later one) of ``query_id``."""
    key = direct_progress_key(query_id, topic)
    raw = kv_get(client, key)
    return raw is not None and DirectProgress.decode(raw, key=key).batch_id >= batch_id


def read_committed_record(client: SyncClient, topic: str, partition_count: int) -> Committed:
    """The topic's committed record, whichever path wrote it last (:func:`load_committed`)."""
    return load_committed(lambda key: kv_get(client, key), topic, partition_count)


def direct_target(client: SyncClient, bucket_uri: str | None, direct: bool | None) -> str | None:
    """The bucket URI the executors write to, or None for the driver path.

    ``direct=None``: the direct path when the objects are on S3 (``bucket_uri``, else the storage the
    data dir recorded). ``direct=True`` also takes a ``file://`` bucket or the data dir's own objects
    folder (executors on this machine only); an in-memory store cannot be shared: ``InvalidArgumentError``.
    """
    from s3stream.binding import recorded_storage_of
    from s3stream.storage.local import LocalObjectStorage
    from s3stream.storage.uri import parse_bucket_uri

    engine = client.client.engine
    uri = bucket_uri
    if uri is None:
        recorded = _run(client, recorded_storage_of(engine.metadata))
        uri = None if recorded is None else recorded.bucket_uri
    if uri is None:
        if direct and isinstance(engine.storage, LocalObjectStorage):
            return f"file://{engine.storage.root}"
        if direct:
            raise InvalidArgumentError("direct=True needs objects the executors can reach: give bucket_uri=")
        return None
    from s3stream.buckets.spec import is_bucket_list

    if is_bucket_list(uri):  # executors cannot record an object's placement: the driver path
        if direct:
            raise InvalidArgumentError("direct=True is not supported over several buckets (s3.data.buckets)")
        return None
    protocol = parse_bucket_uri(uri).protocol
    if protocol == "s3":
        return uri
    if not direct:
        return None
    if protocol == "mem":
        raise InvalidArgumentError(f"direct=True: the executors cannot reach the in-memory bucket {uri!r}")
    return uri
