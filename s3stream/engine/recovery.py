"""What to replay from the WAL after a restart (decide); the engine carries it out (act).

The rule is ``docs/format.md`` section 5.3 (AutoMQ's restart recovery, ``docs/automq-model.md`` section 13):
every body is decoded; KV changes (atomic groups' puts and KV mutation bodies) are kept in WAL order, which is
the order they were applied and acknowledged in (:mod:`s3stream.engine.kvlog`), except those of records at or
below the node's applied KV WAL offset (applied before the crash: re-applying them could undo a newer change
another node made meanwhile). A batch is kept only when its
stream is one this node left open and its epoch is that stream's epoch; batches below the stream's next
expected offset (beginning at the committed end offset) were committed already. A batch above it is held until
its predecessor turns up later in the WAL (a write retried after "WAL full" lands after appends submitted
after it), as AutoMQ buffers out-of-order records; batches still held at the end of the WAL follow a gap and
are dropped. Pure: records in, a frozen plan out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from s3stream.engine.walbody import KvMutation, decode_body
from s3stream.metadata.base import StreamMetadata, TakeoverInfo, TakeoverState
from s3stream.record import StreamRecordBatch


@dataclass(frozen=True, slots=True)
class ReplayRecord:
    """The kept batches of one WAL record."""

    wal_offset: int
    body_size_bytes: int
    batches: tuple[StreamRecordBatch, ...]


@dataclass(frozen=True, slots=True)
class GapInfo:
    stream_id: int
    expected_offset: int
    found_offset: int


@dataclass(frozen=True, slots=True)
class ReplayPlan:
    kv_ops: tuple[KvMutation, ...]
    """Every KV change to re-apply, in WAL order: re-applied in this order, they leave metadata as the
    WAL says."""
    records: tuple[ReplayRecord, ...]
    """WAL records with at least one kept batch, in WAL order (each record's batches in body order)."""
    wal_end_offset: int
    """One past the last WAL record's offset (0 when the WAL held nothing)."""
    gaps: tuple[GapInfo, ...] = ()
    dropped_batch_count: int = 0
    release: tuple[tuple[int, StreamRecordBatch], ...] = ()
    """Every kept batch as ``(index into records, batch)``, in the order to put into the LogCache:
    each stream's batches in offset order, which differs from WAL order where a held batch waited."""

    kv_records: tuple[tuple[int, tuple[KvMutation, ...]], ...] = ()
    """``kv_ops`` by WAL record: ``(wal offset, its changes)``, in WAL order (each applied in one
    metadata transaction with its offset)."""

    @property
    def batch_count(self) -> int:
        return sum(len(r.batches) for r in self.records)


def plan_replay(
    records: Sequence[tuple[int, bytes]],
    opening: Sequence[StreamMetadata],
    *,
    kv_applied_offset: int = -1,
    handed_back: Mapping[int, int] | None = None,
) -> ReplayPlan:
    """The replay plan of the WAL's untrimmed ``(offset, body)`` records (CorruptionError on a bad body);
    KV changes of records at or below ``kv_applied_offset`` are not replayed. ``handed_back``: stream
    id -> an older stream epoch of this node whose batches are kept too (a FAILED takeover handed the
    stream back at a newer epoch, :func:`after_takeover`); those below the end offset are skipped as
    committed, like any other."""
    expected = {int(m.stream_id): m.end_offset for m in opening}
    epochs = {int(m.stream_id): m.epoch for m in opening}
    older = dict(handed_back or {})
    waiting: dict[int, dict[int, tuple[int, int, StreamRecordBatch]]] = {}
    """stream -> base offset -> (record index, position in the body, batch): batches held until their
    predecessor turns up."""
    kv_ops: list[KvMutation] = []
    kv_records: list[tuple[int, tuple[KvMutation, ...]]] = []
    kept_by_record: list[tuple[int, int, list[tuple[int, StreamRecordBatch]]]] = []
    release: list[tuple[int, StreamRecordBatch]] = []
    dropped = 0
    end = 0
    for offset, body in records:
        decoded = decode_body(body, source="WAL", position=offset)
        if decoded.kv_ops and offset > kv_applied_offset:
            kv_ops.extend(decoded.kv_ops)
            kv_records.append((offset, tuple(decoded.kv_ops)))
        index = len(kept_by_record)
        kept: list[tuple[int, StreamRecordBatch]] = []
        kept_by_record.append((offset, len(body), kept))
        for position, batch in enumerate(decoded.batches):
            sid = batch.stream_id
            next_offset = expected.get(sid)
            ours = batch.epoch == epochs.get(sid) or batch.epoch == older.get(sid)
            if next_offset is None or not ours or batch.base_offset < next_offset:
                dropped += 1  # not ours any more, or already committed
                continue
            if batch.base_offset > next_offset:
                # Out of order in the WAL (a write retried after "WAL full" lands after later ones):
                # held until its predecessor turns up; dropped as a gap if it never does.
                held = waiting.setdefault(sid, {})
                if batch.base_offset in held:
                    dropped += 1
                else:
                    held[batch.base_offset] = (index, position, batch)
                continue
            kept.append((position, batch))
            release.append((index, batch))
            expected[sid] = batch.end_offset
            released = waiting.get(sid)
            while released and expected[sid] in released:
                held_index, held_position, held_batch = released.pop(expected[sid])
                kept_by_record[held_index][2].append((held_position, held_batch))
                release.append((held_index, held_batch))
                expected[sid] = held_batch.end_offset
        end = max(end, offset + 1)
    gaps = []
    for sid, held in sorted(waiting.items()):
        if held:
            gaps.append(GapInfo(sid, expected[sid], min(held)))
            dropped += len(held)
    kept_records: list[ReplayRecord] = []
    renumber: dict[int, int] = {}
    for index, (offset, size, kept) in enumerate(kept_by_record):
        if kept:
            renumber[index] = len(kept_records)
            kept_records.append(
                ReplayRecord(offset, size, tuple(b for _, b in sorted(kept, key=lambda item: item[0])))
            )
    return ReplayPlan(
        tuple(kv_ops),
        tuple(kept_records),
        end,
        tuple(gaps),
        dropped,
        tuple((renumber[index], batch) for index, batch in release),
        tuple(kv_records),
    )


@dataclass(frozen=True, slots=True)
class TakeoverAdjustment:
    """How the last takeover of this node changes its restart replay (:func:`after_takeover`)."""

    kv_applied_offset: int
    """The applied KV WAL offset to plan with."""
    handed_back: Mapping[int, int]
    """Stream id -> this node's stream epoch at the fence, for the streams a FAILED takeover handed back."""


def after_takeover(
    takeover: TakeoverInfo | None,
    opening: Sequence[StreamMetadata],
    *,
    kv_applied_offset: int,
    wal_end_offset: int,
) -> TakeoverAdjustment:
    """The replay inputs of a node whose last takeover is ``takeover`` (None: never taken over).

    - **DONE**, and the applied KV offset is still the one ``finish_takeover`` left
      (``takeover.wal_end_offset - 1``): the taker replayed the WAL up to there; every record after it
      was written by the fenced session after the taker's read and never acknowledged, so none of its
      KV changes is applied (the offset to plan with covers the whole WAL, ``wal_end_offset - 1``).
      A later session's applied record moves the offset past that mark, so this holds only for the
      first restart after the takeover (a later unapplied record at exactly that mark was never
      acknowledged either).
    - **FAILED**: the streams it handed back carry a newer epoch than this node's batches in the WAL:
      those batches (at the fence's epoch) are kept (``handed_back``).
    """
    none = TakeoverAdjustment(kv_applied_offset, {})
    if takeover is None:
        return none
    if takeover.state == TakeoverState.DONE:
        read_end = takeover.wal_end_offset
        if read_end > 0 and kv_applied_offset == read_end - 1 and wal_end_offset > read_end:
            return TakeoverAdjustment(wal_end_offset - 1, {})
        return none
    if takeover.state == TakeoverState.FAILED:
        dead = dict(takeover.streams)
        back = {
            int(m.stream_id): dead[m.stream_id]
            for m in opening
            if m.stream_id in dead and m.epoch > dead[m.stream_id]
        }
        return TakeoverAdjustment(kv_applied_offset, back)
    return none
