"""KV changes applied to metadata in WAL order: the engine's one total order of KV mutations.

Every KV change (``kv.put``, ``kv.put_if_absent``, ``kv.delete`` and an atomic group's puts) is
written to the WAL first, then applied to metadata strictly in WAL offset order, one record at a
time, and acknowledged only once applied. WAL offset order is usually submission order, but not
always: a write retried after "WAL full" lands after records submitted later. Applying (and so
acknowledging) in WAL order keeps metadata the result of a prefix of the WAL's KV changes, so that
replaying the untrimmed suffix after a crash (``plan_replay``, WAL order) leaves it exactly as
acknowledged: an older atomic group's put can never overwrite a newer plain put, and a retried put
can never be replayed in an order other than the one its caller saw. The WAL completes appends in
offset order, so records become durable (:meth:`KvApplier.persisted`) in that order. A record stays
live for the WAL trim until it is applied (:class:`~s3stream.engine.waltrim.WalTrimTracker`).

Shared metadata (several nodes): a record's changes are applied in ONE metadata transaction together
with the node's applied KV WAL offset (:meth:`~s3stream.metadata.base.MetadataStore.kv_apply`). A
replay skips the records at or below it, so a restart never re-applies a change that was applied
before the crash over a newer value another node wrote meanwhile; a record whose apply did not
commit is above it and is re-applied. A change whose apply failed (its writer got the error) is
re-applied by a restart only if no later record was applied since.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Sequence

from s3stream.engine.supervisor import Supervisor
from s3stream.engine.walbody import KvMutation, KvOp
from s3stream.engine.waltrim import WalTrimTracker
from s3stream.errors import InvalidArgumentError, S3StreamError
from s3stream.ids import NodeId
from s3stream.logfmt import log_event
from s3stream.metadata.base import KvWrite, MetadataStore

log = logging.getLogger(__name__)

DIRECT_KV_PREFIX = "direct/"
"""KV keys written only by external commits (``commit_objects``, :mod:`s3stream.engine.external`),
never through the WAL: the append path refuses them, so a WAL replay cannot put an older value back."""


def check_wal_key(key: str) -> None:
    """InvalidArgumentError for a key the WAL's KV path must not write (under :data:`DIRECT_KV_PREFIX`)."""
    if isinstance(key, str) and key.startswith(DIRECT_KV_PREFIX):
        raise InvalidArgumentError(
            f"KV keys under {DIRECT_KV_PREFIX!r} are written only by external commits, never through "
            f"the WAL, got {key!r:.80}"
        )


def kv_write(mutation: KvMutation) -> KvWrite:
    """The metadata write of one WAL KV change."""
    if mutation.op is KvOp.DELETE:
        return KvWrite(mutation.key, None)
    return KvWrite(mutation.key, mutation.value, overwrite=mutation.op is KvOp.PUT)


async def apply_record(
    metadata: MetadataStore, mutations: Sequence[KvMutation], *, node_id: NodeId, wal_offset: int
) -> list[bytes | None]:
    """Apply one WAL record's changes and mark it applied, in one metadata transaction; returns per
    change what the KV client returns (the value stored, or the deleted one)."""
    return await metadata.kv_apply([kv_write(m) for m in mutations], node_id=node_id, wal_offset=wal_offset)


class KvEntry:
    """The KV changes of one WAL record, waiting for durability and their turn."""

    __slots__ = ("future", "mutations", "seq", "wal_offset")

    def __init__(self, seq: int, mutations: Sequence[KvMutation], future: asyncio.Future[list[bytes | None]]):
        self.seq = seq
        self.mutations = tuple(mutations)
        self.future = future
        self.wal_offset = -1
        """Set once durable."""


class KvApplier:
    """Applies the KV changes of durable WAL records to metadata in WAL offset order."""

    def __init__(
        self,
        metadata: MetadataStore,
        trim_tracker: WalTrimTracker,
        supervisor: Supervisor,
        *,
        node_id: NodeId,
    ) -> None:
        self.metadata = metadata
        self.node_id = node_id
        self.trim_tracker = trim_tracker
        self.supervisor = supervisor
        self._unapplied: dict[int, KvEntry] = {}
        """seq -> every entry submitted and not yet applied (durable or not)."""
        self._queue: deque[KvEntry] = deque()
        """Durable entries not yet applied, in WAL offset order."""
        self._last_wal_offset = -1
        self._draining = False

    def submit(self, seq: int, mutations: Sequence[KvMutation]) -> KvEntry:
        """Register a record's changes before its WAL write (no await between)."""
        entry = KvEntry(seq, mutations, asyncio.get_running_loop().create_future())
        self._unapplied[seq] = entry
        return entry

    def persisted(self, entry: KvEntry, wal_offset: int) -> None:
        """The record is durable at ``wal_offset``: apply it after every record durable before it."""
        assert wal_offset > self._last_wal_offset, "the WAL completes appends in offset order"
        self._last_wal_offset = wal_offset
        entry.wal_offset = wal_offset
        self._queue.append(entry)
        self._kick()

    def failed(self, entry: KvEntry) -> None:
        """The record's WAL write failed: it changes nothing (its writer raises its own error)."""
        self._unapplied.pop(entry.seq, None)
        if entry in self._queue:
            self._queue.remove(entry)
        if not entry.future.done():
            entry.future.cancel()
        self._kick()

    def fail_all(self, error: S3StreamError) -> None:
        for entry in self._unapplied.values():
            if not entry.future.done():
                entry.future.set_exception(error)
                entry.future.exception()  # retrieved: its writer may have failed on its own
        self._unapplied.clear()
        self._queue.clear()

    def _kick(self) -> None:
        if not self._draining and self._queue:
            self._draining = True
            self.supervisor.spawn(self._drain(), name="s3stream-kv-apply")

    async def _drain(self) -> None:
        try:
            queue = self._queue
            while queue:
                entry = queue[0]
                try:
                    results = await apply_record(
                        self.metadata, entry.mutations, node_id=self.node_id, wal_offset=entry.wal_offset
                    )
                except S3StreamError as exc:
                    # The change stays in the WAL: a restart re-applies it in order. Tell the writer.
                    log_event(log, logging.WARNING, "kv.apply_failed", wal_offset=entry.wal_offset, error=exc)
                    self._applied(entry)
                    if not entry.future.done():
                        entry.future.set_exception(exc)
                    continue
                self._applied(entry)
                if not entry.future.done():
                    entry.future.set_result(results)
        finally:
            self._draining = False

    def _applied(self, entry: KvEntry) -> None:
        if self._queue and self._queue[0] is entry:
            self._queue.popleft()
        self._unapplied.pop(entry.seq, None)
        self.trim_tracker.committed([entry.seq])
