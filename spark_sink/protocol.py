"""The sink's exactly-once protocol, pure: chunking a micro-batch and deciding what a replay writes.

Spark writes ``offsets/N`` before micro-batch N runs and ``commits/N`` after the sink returns; any
failure in between re-runs batch N with the same source range. The sink therefore commits its own
progress record -- (query id, topic) -> (batch id, chunks committed, chunk digests) -- in the same
``append_atomic`` call (one WAL record) as each chunk's data. A replay reads the progress record and
:func:`plan_batch` says which chunks are still to be written. The LAST chunk of a micro-batch also
carries the topic's :class:`Committed` record (every partition's committed end offset): readers stop
there, so the chunks of an unfinished micro-batch are never visible through the sink's reader.
Chunk 0 of a multi-chunk micro-batch carries the topic's :class:`Writer` record (who may leave one
unfinished). ``spark_sink abandon`` (:mod:`spark_sink.abandon`) puts an unfinished micro-batch's
chunks into the committed record's discarded ranges and marks its progress record abandoned. The
protocol is documented in ``docs/spark-sink.md`` section "Exactly once".
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import crc32c

from s3stream.errors import ConflictError, CorruptionError

PROGRESS_VERSION = 2
"""2 added ``abandoned``; version 1 is read as not abandoned."""
COMMITTED_VERSION = 2
"""2 added ``discarded``; version 1 is read as nothing discarded."""
WRITER_VERSION = 1
DISCARDED_RANGES_MAX = 1000
"""Discarded ranges a topic's committed record may hold (``spark_sink abandon`` refuses beyond)."""
APPEND_OVERHEAD_BYTES = 128
"""Bytes a chunk budgets per appended batch besides its payload (WAL and batch headers)."""
KV_OVERHEAD_BYTES = 1024
"""Bytes a chunk budgets for the progress and writer records (keys included)."""
QUERY_ID_MAX_BYTES = 128
"""Longest query id (UTF-8) the sink takes: keeps the progress and writer records within
``KV_OVERHEAD_BYTES`` next to the longest topic name (Spark's query ids are 36-character UUIDs)."""

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


def committed_max_bytes(partition_count: int, discarded_count: int = 0) -> int:
    """An upper bound of ``len(Committed(...).encode())`` for a topic of ``partition_count`` partitions
    and ``discarded_count`` discarded ranges."""
    # 20 digits and a comma per end, [p,start,end], per range; the rest is the JSON frame
    return 512 + 21 * partition_count + discarded_max_bytes(discarded_count)


def discarded_max_bytes(discarded_count: int) -> int:
    """Bytes ``discarded_count`` discarded ranges add to a committed record at most."""
    return 50 * discarded_count  # "[" 5 digits "," 20 digits "," 20 digits "],"


def writer_key(topic: str) -> str:
    """The KV key of a topic's :class:`Writer` record."""
    return f"spark_sink/topic/{topic}/writer"


def progress_key(query_id: str, topic: str) -> str:
    """The KV key of a streaming query's progress record on ``topic`` (one per topic: a query may
    write several topics, through one sink each)."""
    return f"spark_sink/query/{query_id}/topic/{topic}/progress"


def legacy_progress_key(query_id: str) -> str:
    """Where sinks before per-topic progress records kept a query's progress (one topic per query)."""
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
    abandoned: bool = False
    """Set by ``spark_sink abandon`` on an unfinished batch: its chunks were discarded, a replay of
    ``batch_id`` is refused."""

    def __post_init__(self) -> None:
        assert 0 < self.chunks_done <= self.chunk_count
        assert not (self.abandoned and self.complete), "only an unfinished batch can be abandoned"

    @property
    def complete(self) -> bool:
        return self.chunks_done == self.chunk_count

    @property
    def unfinished(self) -> bool:
        """Chunks of ``batch_id`` are in the streams, invisible, waiting for the replay to finish it."""
        return not self.complete and not self.abandoned

    def encode(self) -> bytes:
        return json.dumps(
            {
                "version": PROGRESS_VERSION,
                "batch_id": self.batch_id,
                "chunk_count": self.chunk_count,
                "chunks_done": self.chunks_done,
                "chain": self.chain,
                "abandoned": self.abandoned,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, raw: bytes, *, key: str) -> Progress:
        try:
            obj = json.loads(raw)
            if obj["version"] not in (1, PROGRESS_VERSION):
                raise ValueError(f"version {obj['version']}")
            abandoned = obj["abandoned"] if obj["version"] >= 2 else False
            if not isinstance(abandoned, bool):
                raise ValueError(f"abandoned {abandoned!r}")
            progress = cls(
                int(obj["batch_id"]),
                int(obj["chunk_count"]),
                int(obj["chunks_done"]),
                int(obj["chain"]),
                abandoned,
            )
        except (ValueError, KeyError, TypeError, AssertionError) as exc:
            raise CorruptionError(f"bad sink progress record: {exc}", source=f"kv:{key}") from exc
        return progress


def chunk_payloads(
    payloads: Sequence[PayloadRef], chunk_max_bytes: int, *, kv_max_bytes: int = KV_OVERHEAD_BYTES
) -> list[Chunk]:
    """Cut the payloads, in order, into chunks of at most ``chunk_max_bytes`` bytes each.

    Every chunk keeps ``kv_max_bytes`` for the KV records committed with it.
    """
    chunks: list[Chunk] = []
    current: list[PayloadRef] = []
    size = kv_max_bytes
    for ref in payloads:
        need = ref.size_bytes + APPEND_OVERHEAD_BYTES
        assert need + kv_max_bytes <= chunk_max_bytes, "a payload must fit in a chunk"
        if current and size + need > chunk_max_bytes:
            chunks.append(_chunk(current))
            current = []
            size = kv_max_bytes
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
      the rest;
    - this batch abandoned (``spark_sink abandon`` discarded its chunks): :class:`ConflictError`.
    """
    n = len(chunks)
    if progress is None or progress.batch_id < batch_id:
        return BatchPlan(batch_id, 0, n)
    if progress.batch_id > batch_id:
        return BatchPlan(batch_id, n, n)
    if progress.abandoned:
        raise ConflictError(
            f"micro-batch {batch_id} was abandoned by an operator (spark_sink abandon) after "
            f"{progress.chunks_done} of {progress.chunk_count} chunks: its records were discarded and "
            "it cannot be replayed; start the query from a new checkpoint"
        )
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
class DiscardedRange:
    """Offsets ``[start_offset, end_offset)`` of one partition that no reader returns (abandoned)."""

    partition: int
    start_offset: int
    end_offset: int


@dataclass(frozen=True, slots=True)
class Committed:
    """A topic's read-committed state: ``ends[p]`` is the committed end offset of partition ``p``.

    Written with the last chunk of every micro-batch; readers return records below the ends only,
    except those in ``discarded`` (ranges ``spark_sink abandon`` put behind the ends, sorted by
    partition and offset, kept by every later record). ``query_id``/``batch_id`` name the
    micro-batch that wrote it (diagnostics).
    """

    ends: tuple[int, ...]
    query_id: str
    batch_id: int
    discarded: tuple[DiscardedRange, ...] = ()

    def __post_init__(self) -> None:
        assert all(e >= 0 for e in self.ends)
        assert _discarded_problem(self.discarded, self.ends) is None, self.discarded

    @classmethod
    def empty(cls, partition_count: int) -> Committed:
        """The state of a topic no micro-batch has completed: nothing is committed."""
        return cls((0,) * partition_count, "", -1)

    def readable(self, partition: int, start_offset: int, end_offset: int) -> list[tuple[int, int]]:
        """``[start_offset, end_offset)`` of ``partition`` without its discarded ranges, in order."""
        out: list[tuple[int, int]] = []
        pos = start_offset
        for r in self.discarded:
            if r.partition != partition or r.end_offset <= pos:
                continue
            if r.start_offset >= end_offset:
                break
            if r.start_offset > pos:
                out.append((pos, r.start_offset))
            pos = r.end_offset
        if pos < end_offset:
            out.append((pos, end_offset))
        return out

    def encode(self) -> bytes:
        return json.dumps(
            {
                "version": COMMITTED_VERSION,
                "ends": list(self.ends),
                "discarded": [[r.partition, r.start_offset, r.end_offset] for r in self.discarded],
                "query_id": self.query_id,
                "batch_id": self.batch_id,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, raw: bytes, *, key: str, partition_count: int) -> Committed:
        try:
            obj = json.loads(raw)
            if obj["version"] not in (1, COMMITTED_VERSION):
                raise ValueError(f"version {obj['version']}")
            ends = tuple(int(e) for e in obj["ends"])
            if len(ends) != partition_count:
                raise ValueError(f"{len(ends)} ends for {partition_count} partitions")
            if any(e < 0 for e in ends):
                raise ValueError(f"negative end offset in {ends}")
            raw_ranges = obj["discarded"] if obj["version"] >= 2 else []
            discarded = tuple(DiscardedRange(int(p), int(s), int(e)) for p, s, e in raw_ranges)
            problem = _discarded_problem(discarded, ends)
            if problem is not None:
                raise ValueError(problem)
            committed = cls(ends, str(obj["query_id"]), int(obj["batch_id"]), discarded)
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptionError(f"bad committed-offsets record: {exc}", source=f"kv:{key}") from exc
        return committed


def _discarded_problem(discarded: Sequence[DiscardedRange], ends: Sequence[int]) -> str | None:
    """What is wrong with ``discarded`` for a topic with committed ``ends``, or None.

    Every range lies below its partition's end, is not empty, and the ranges are sorted by
    (partition, offset) without overlapping.
    """
    if len(discarded) > DISCARDED_RANGES_MAX:
        return f"{len(discarded)} discarded ranges, above {DISCARDED_RANGES_MAX}"
    prev: DiscardedRange | None = None
    for r in discarded:
        if not (0 <= r.partition < len(ends) and 0 <= r.start_offset < r.end_offset <= ends[r.partition]):
            return f"discarded range {r} is outside the committed ends {tuple(ends)}"
        if prev is not None and (r.partition, r.start_offset) < (prev.partition, prev.end_offset):
            return f"discarded ranges {prev} and {r} overlap or are out of order"
        prev = r
    return None


@dataclass(frozen=True, slots=True)
class Writer:
    """The query and micro-batch that last started a multi-chunk write to a topic.

    Written with chunk 0 of every micro-batch of more than one chunk: the only kind that can be
    left unfinished, and (one writer per topic) the only one that can be. ``spark_sink abandon``
    follows it to the progress record of the unfinished batch.
    """

    query_id: str
    batch_id: int

    def encode(self) -> bytes:
        return json.dumps(
            {"version": WRITER_VERSION, "query_id": self.query_id, "batch_id": self.batch_id},
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, raw: bytes, *, key: str) -> Writer:
        try:
            obj = json.loads(raw)
            if obj["version"] != WRITER_VERSION:
                raise ValueError(f"version {obj['version']}")
            query_id = obj["query_id"]
            if not isinstance(query_id, str):
                raise ValueError(f"query_id {query_id!r}")
            writer = cls(query_id, int(obj["batch_id"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptionError(f"bad sink writer record: {exc}", source=f"kv:{key}") from exc
        return writer


def load_progress(
    get: Callable[[str], bytes | None], query_id: str, topic: str, committed: Committed
) -> Progress | None:
    """The progress record of ``query_id`` on ``topic``, read with ``get`` (a KV get), or None.

    A record under :func:`legacy_progress_key` (written by an older sink, which supported one topic
    per query) counts for ``topic`` only if the topic's writer or committed record names the query:
    its batches were written to this topic. It is never rewritten; the next chunk writes the
    per-topic record, which wins from then on.
    """
    key = progress_key(query_id, topic)
    raw = get(key)
    if raw is not None:
        return Progress.decode(raw, key=key)
    legacy = legacy_progress_key(query_id)
    raw = get(legacy)
    if raw is None:
        return None
    named = {committed.query_id}
    writer_raw = get(writer_key(topic))
    if writer_raw is not None:
        named.add(Writer.decode(writer_raw, key=writer_key(topic)).query_id)
    return Progress.decode(raw, key=legacy) if query_id in named else None


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
    return Committed(ends, query_id, plan.batch_id, committed.discarded)
