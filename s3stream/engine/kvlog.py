"""KV changes applied to metadata in WAL order: the engine's one total order of KV mutations.

Every KV change (``kv.put``, ``kv.put_if_absent``, ``kv.delete`` and an atomic group's puts) is
written to the WAL first, then applied to metadata strictly in WAL submission order, one record at a
time, and acknowledged only once applied. Metadata therefore always holds the result of a prefix of
the WAL's KV changes, and replaying the untrimmed suffix after a crash (``plan_replay``) leaves it as
the WAL says: an older atomic group's put can never overwrite a newer plain put. A record stays live
for the WAL trim until it is applied (:class:`~s3stream.engine.waltrim.WalTrimTracker`).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Sequence

from s3stream.engine.supervisor import Supervisor
from s3stream.engine.walbody import KvMutation, KvOp
from s3stream.engine.waltrim import WalTrimTracker
from s3stream.errors import S3StreamError
from s3stream.metadata.base import MetadataStore

log = logging.getLogger(__name__)


async def apply_mutation(metadata: MetadataStore, mutation: KvMutation) -> bytes | None:
    """Apply one change; returns what the KV client returns (the value stored, or the deleted one)."""
    if mutation.op is KvOp.PUT:
        return await metadata.kv_put(mutation.key, mutation.value, overwrite=True)
    if mutation.op is KvOp.PUT_IF_ABSENT:
        return await metadata.kv_put(mutation.key, mutation.value, overwrite=False)
    return await metadata.kv_delete(mutation.key)


class KvEntry:
    """The KV changes of one WAL record, waiting for durability and their turn."""

    __slots__ = ("future", "mutations", "persisted", "seq")

    def __init__(self, seq: int, mutations: Sequence[KvMutation], future: asyncio.Future[list[bytes | None]]):
        self.seq = seq
        self.mutations = tuple(mutations)
        self.future = future
        self.persisted = False


class KvApplier:
    """Applies the KV changes of durable WAL records to metadata in submission order."""

    def __init__(self, metadata: MetadataStore, live: WalTrimTracker, supervisor: Supervisor) -> None:
        self.metadata = metadata
        self.live = live
        self.supervisor = supervisor
        self._queue: deque[KvEntry] = deque()
        self._draining = False

    def submit(self, seq: int, mutations: Sequence[KvMutation]) -> KvEntry:
        """Queue a record's changes; call in seq order, before its WAL write (no await between)."""
        assert not self._queue or self._queue[-1].seq < seq, "seqs must grow"
        entry = KvEntry(seq, mutations, asyncio.get_running_loop().create_future())
        self._queue.append(entry)
        return entry

    def persisted(self, entry: KvEntry) -> None:
        """The record is durable in the WAL: apply it once every earlier one is applied."""
        entry.persisted = True
        self._kick()

    def failed(self, entry: KvEntry) -> None:
        """The record's WAL write failed: it changes nothing (its writer raises its own error)."""
        if entry in self._queue:
            self._queue.remove(entry)
        if not entry.future.done():
            entry.future.cancel()
        self._kick()

    def fail_all(self, error: S3StreamError) -> None:
        for entry in self._queue:
            if not entry.future.done():
                entry.future.set_exception(error)
                entry.future.exception()  # retrieved: its writer may have failed on its own
        self._queue.clear()

    def _kick(self) -> None:
        if not self._draining and self._queue and self._queue[0].persisted:
            self._draining = True
            self.supervisor.spawn(self._drain(), name="s3stream-kv-apply")

    async def _drain(self) -> None:
        try:
            queue = self._queue
            while queue and queue[0].persisted:
                entry = queue[0]
                try:
                    results = [await apply_mutation(self.metadata, m) for m in entry.mutations]
                except S3StreamError as exc:
                    # The change stays in the WAL: a restart re-applies it in order. Tell the writer.
                    log.warning("KV change of WAL record %d failed to apply: %s", entry.seq, exc)
                    if queue and queue[0] is entry:
                        queue.popleft()
                    self.live.committed([entry.seq])
                    if not entry.future.done():
                        entry.future.set_exception(exc)
                    continue
                if queue and queue[0] is entry:
                    queue.popleft()
                self.live.committed([entry.seq])
                if not entry.future.done():
                    entry.future.set_result(results)
        finally:
            self._draining = False
