"""What to replay from the WAL after a restart (decide); the engine carries it out (act).

The rule is ``docs/format.md`` section 5.3 (AutoMQ reference 3.11 step 5): every body is decoded;
KV changes (atomic groups' puts and KV mutation bodies) are kept in WAL order; a batch is kept only when its stream is one this node left open, its
epoch is that stream's epoch and it starts exactly at the stream's next expected offset (beginning
at the committed end offset). Batches below that offset were committed already; a batch above it
follows a gap and is dropped, as is everything after it. Pure: records in, a frozen plan out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from s3stream.engine.walbody import KvMutation, decode_body
from s3stream.metadata.base import StreamMetadata
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
    """Every KV change in WAL order: re-applied in this order, they leave metadata as the WAL says."""
    records: tuple[ReplayRecord, ...]
    """WAL records with at least one kept batch, in WAL order."""
    wal_end_offset: int
    """One past the last WAL record's offset (0 when the WAL held nothing)."""
    gaps: tuple[GapInfo, ...] = ()
    dropped_batch_count: int = 0

    @property
    def batch_count(self) -> int:
        return sum(len(r.batches) for r in self.records)


def plan_replay(records: Sequence[tuple[int, bytes]], opening: Sequence[StreamMetadata]) -> ReplayPlan:
    """The replay plan of the WAL's untrimmed ``(offset, body)`` records (CorruptionError on a bad body)."""
    expected = {int(m.stream_id): m.end_offset for m in opening}
    epochs = {int(m.stream_id): m.epoch for m in opening}
    gapped: set[int] = set()
    kv_ops: list[KvMutation] = []
    kept_records: list[ReplayRecord] = []
    gaps: list[GapInfo] = []
    dropped = 0
    end = 0
    for offset, body in records:
        decoded = decode_body(body, source="WAL", position=offset)
        kv_ops.extend(decoded.kv_ops)
        kept: list[StreamRecordBatch] = []
        for batch in decoded.batches:
            sid = batch.stream_id
            next_offset = expected.get(sid)
            if (
                next_offset is None
                or sid in gapped
                or batch.epoch != epochs[sid]
                or batch.base_offset < next_offset
            ):
                dropped += 1  # not ours any more, already committed, or after a gap
                continue
            if batch.base_offset > next_offset:
                gapped.add(sid)
                gaps.append(GapInfo(sid, next_offset, batch.base_offset))
                dropped += 1
                continue
            kept.append(batch)
            expected[sid] = batch.end_offset
        end = max(end, offset + 1)
        if kept:
            kept_records.append(ReplayRecord(offset, len(body), tuple(kept)))
    return ReplayPlan(tuple(kv_ops), tuple(kept_records), end, tuple(gaps), dropped)
