"""The sink's exactly-once protocol, pure: chunking a micro-batch and deciding what a replay writes.

Spark writes ``offsets/N`` before micro-batch N runs and ``commits/N`` after the sink returns; any
failure in between re-runs batch N with the same source range. The sink therefore commits its own
progress record -- (query id) -> (batch id, chunks committed, chunk digests) -- in the same
``append_atomic`` call (one WAL record) as each chunk's data. A replay reads the progress record and
:func:`plan_batch` says which chunks are still to be written. The LAST chunk of a micro-batch also
carries the topic's :class:`Committed` record (every partition's committed end offset): readers stop
there, so the chunks of an unfinished micro-batch are never visible through the sink's reader. The
protocol is documented in ``docs/spark-sink.md`` section "Exactly once".
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import crc32c

from s3stream.errors import ConflictError, CorruptionError

PROGRESS_VERSION = 1
COMMITTED_VERSION = 1
APPEND_OVERHEAD_BYTES = 128
"""Bytes a chunk budgets per appended batch besides its payload (WAL and batch headers)."""
KV_OVERHEAD_BYTES = 1024
"""Bytes a chunk budgets for the progress record."""

_DIGEST_ENTRY = struct.Struct(
    ">"
    "i"  # target partition
    "i"  # record count
    "I"  # CRC-32C of the records area of the Kafka batch (after its header)
)


_CHAIN_ENTRY = struct.Struct(">I")  # one chunk digest


def committed_key(topic: str) -> str:
    """The KV key of a topic's :class:`Committed` record."""
    return f"spark_sink/topic/{topic}/committed"


def committed_bytes_max(partition_count: int) -> int:
    """An upper bound of ``len(Committed(...).encode())`` for a topic of ``partition_count`` partitions."""
    return 512 + 21 * partition_count  # 20 digits and a comma per end; the rest is the JSON frame


def progress_key(query_id: str) -> str:
    """The KV key of a streaming query's progress record."""
    return f"spark_sink/query/{query_id}/progress"


@dataclass(frozen=True, slots=True)
class PayloadRef:
    """One encoded Kafka batch of a micro-batch, in the deterministic order of the micro-batch."""

    index: int
    """Position in the collected payload list."""
    partition: int
    record_count: int
    content_crc: int
    size_bytes: int


@dataclass(frozen=True, slots=True)
class Chunk:
    """Payloads committed together in one ``append_atomic``; all or nothing."""

    payloads: tuple[PayloadRef, ...]
    digest: int

    @property
    def record_count(self) -> int:
        return sum(p.record_count for p in self.payloads)


@dataclass(frozen=True, slots=True)
class Progress:
    """What the engine holds for a query: the last batch it touched and how far it got."""

    batch_id: int
    chunk_count: int
    chunks_done: int
    chain: int
    """:func:`chain_digest` of chunks ``[0, chunks_done)`` of ``batch_id``."""

    def __post_init__(self) -> None:
        assert 0 < self.chunks_done <= self.chunk_count

    @property
    def complete(self) -> bool:
        return self.chunks_done == self.chunk_count

    def encode(self) -> bytes:
        return json.dumps(
            {
                "version": PROGRESS_VERSION,
                "batch_id": self.batch_id,
                "chunk_count": self.chunk_count,
                "chunks_done": self.chunks_done,
                "chain": self.chain,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, raw: bytes, *, key: str) -> Progress:
        try:
            obj = json.loads(raw)
            if obj["version"] != PROGRESS_VERSION:
                raise ValueError(f"version {obj['version']}")
            progress = cls(
                int(obj["batch_id"]),
                int(obj["chunk_count"]),
                int(obj["chunks_done"]),
                int(obj["chain"]),
            )
        except (ValueError, KeyError, TypeError, AssertionError) as exc:
            raise CorruptionError(f"bad sink progress record: {exc}", source=f"kv:{key}") from exc
        return progress


def chunk_payloads(
    payloads: Sequence[PayloadRef], chunk_bytes_max: int, *, kv_bytes_max: int = KV_OVERHEAD_BYTES
) -> list[Chunk]:
    """Cut the payloads, in order, into chunks of at most ``chunk_bytes_max`` bytes each.

    Every chunk keeps ``kv_bytes_max`` for the KV records committed with it.
    """
    chunks: list[Chunk] = []
    current: list[PayloadRef] = []
    size = kv_bytes_max
    for ref in payloads:
        need = ref.size_bytes + APPEND_OVERHEAD_BYTES
        assert need + kv_bytes_max <= chunk_bytes_max, "a payload must fit in a chunk"
        if current and size + need > chunk_bytes_max:
            chunks.append(_chunk(current))
            current = []
            size = kv_bytes_max
        current.append(ref)
        size += need
    if current:
        chunks.append(_chunk(current))
    return chunks


def _chunk(refs: list[PayloadRef]) -> Chunk:
    digest = 0
    for ref in refs:
        digest = crc32c.crc32c(_DIGEST_ENTRY.pack(ref.partition, ref.record_count, ref.content_crc), digest)
    return Chunk(tuple(refs), digest)


@dataclass(frozen=True, slots=True)
class BatchPlan:
    """Which chunks of a micro-batch to write: ``[first_chunk, len(chunks))``."""

    batch_id: int
    first_chunk: int
    chunk_count: int

    @property
    def skip(self) -> bool:
        return self.first_chunk >= self.chunk_count


def plan_batch(progress: Progress | None, batch_id: int, chunks: Sequence[Chunk]) -> BatchPlan:
    """Decide what micro-batch ``batch_id`` still has to write, given the committed progress.

    - no progress, or progress of an older batch: write every chunk;
    - progress of a newer batch, or this batch complete: write nothing (a replay of committed data);
    - this batch partly committed: the replay must have cut the same chunks (same digests) for the
      committed part, else :class:`ConflictError` (the source did not replay the same rows); write
      the rest.
    """
    n = len(chunks)
    if progress is None or progress.batch_id < batch_id:
        return BatchPlan(batch_id, 0, n)
    if progress.batch_id > batch_id:
        return BatchPlan(batch_id, n, n)
    if progress.chunk_count != n or chain_digest(chunks[: progress.chunks_done]) != progress.chain:
        raise ConflictError(
            f"micro-batch {batch_id} was replayed with different data: {progress.chunks_done} of "
            f"{progress.chunk_count} chunks were committed before, the replay has {n} chunks"
            + ("" if progress.chunk_count != n else " with different contents")
            + "; the source must replay a micro-batch with the same rows in the same order"
        )
    return BatchPlan(batch_id, progress.chunks_done, n)


def progress_after(plan: BatchPlan, chunks: Sequence[Chunk], chunk_index: int) -> Progress:
    """The progress record committed together with chunk ``chunk_index``."""
    assert plan.first_chunk <= chunk_index < plan.chunk_count
    return Progress(
        plan.batch_id,
        plan.chunk_count,
        chunk_index + 1,
        chain_digest(chunks[: chunk_index + 1]),
    )


def chain_digest(chunks: Sequence[Chunk]) -> int:
    """One CRC-32C over the digests of ``chunks`` in order."""
    chain = 0
    for c in chunks:
        chain = crc32c.crc32c(_CHAIN_ENTRY.pack(c.digest), chain)
    return chain


@dataclass(frozen=True, slots=True)
class Committed:
    """A topic's read-committed state: ``ends[p]`` is the committed end offset of partition ``p``.

    Written with the last chunk of every micro-batch; readers return records below the ends only.
    ``query_id``/``batch_id`` name the micro-batch that wrote it (diagnostics).
    """

    ends: tuple[int, ...]
    query_id: str
    batch_id: int

    def __post_init__(self) -> None:
        assert all(e >= 0 for e in self.ends)

    @classmethod
    def empty(cls, partition_count: int) -> Committed:
        """The state of a topic no micro-batch has completed: nothing is committed."""
        return cls((0,) * partition_count, "", -1)

    def encode(self) -> bytes:
        return json.dumps(
            {
                "version": COMMITTED_VERSION,
                "ends": list(self.ends),
                "query_id": self.query_id,
                "batch_id": self.batch_id,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, raw: bytes, *, key: str, partition_count: int) -> Committed:
        try:
            obj = json.loads(raw)
            if obj["version"] != COMMITTED_VERSION:
                raise ValueError(f"version {obj['version']}")
            ends = tuple(int(e) for e in obj["ends"])
            if len(ends) != partition_count:
                raise ValueError(f"{len(ends)} ends for {partition_count} partitions")
            if any(e < 0 for e in ends):
                raise ValueError(f"negative end offset in {ends}")
            committed = cls(ends, str(obj["query_id"]), int(obj["batch_id"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptionError(f"bad committed-offsets record: {exc}", source=f"kv:{key}") from exc
        return committed


def partition_record_counts(chunks: Sequence[Chunk], partition_count: int) -> list[int]:
    """How many records ``chunks`` hold per partition."""
    counts = [0] * partition_count
    for chunk in chunks:
        for ref in chunk.payloads:
            counts[ref.partition] += ref.record_count
    return counts


def expected_next_offsets(committed: Committed, chunks: Sequence[Chunk], plan: BatchPlan) -> list[int]:
    """Each partition's next offset before chunk ``plan.first_chunk`` is appended.

    The committed ends plus the records of the chunks of this micro-batch already written (a resumed
    batch); anything else in a stream was written by someone other than this sink's protocol.
    """
    done = () if plan.skip else chunks[: plan.first_chunk]
    counts = partition_record_counts(done, len(committed.ends))
    return [e + c for e, c in zip(committed.ends, counts, strict=True)]


def committed_after(
    committed: Committed, chunks: Sequence[Chunk], plan: BatchPlan, *, query_id: str
) -> Committed:
    """The :class:`Committed` record written with the last chunk of ``plan``'s micro-batch."""
    counts = partition_record_counts(chunks, len(committed.ends))
    ends = tuple(e + c for e, c in zip(committed.ends, counts, strict=True))
    return Committed(ends, query_id, plan.batch_id)
