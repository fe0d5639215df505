"""The operator tool that discards the records a topic holds past its committed ends, never showing them.

Records past a partition's committed end are the chunks of a micro-batch left unfinished (its query
crashed and its source cannot replay it: ``ConflictError`` on replay), or records appended outside
the sink. Until they go, no query can write the topic (``docs/spark-sink.md`` "Offset checks").
:func:`abandon_unfinished` (``python -m spark_sink abandon``) puts them behind the committed ends
as **discarded ranges** in ONE ``append_atomic`` of KV records:

- the topic's :class:`~spark_sink.protocol.Committed` record gains ``[committed end, stream end)``
  of every partition that has records past its end, and its ends move to the streams' ends: the
  sink's next micro-batch appends after them, every reader skips them;
- the progress record of the unfinished micro-batch (found through the topic's
  :class:`~spark_sink.protocol.Writer` record, or named with ``query_id``) is marked abandoned:
  its query's replay of that batch fails with ``ConflictError`` instead of completing it.

A crash leaves the old state or the new one. :func:`plan_abandon` decides (pure); the executor
reads the state and applies the plan. Documented in ``docs/spark-sink.md`` section "Abandoning an
unfinished micro-batch".
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from s3stream.assembly import open_sync
from s3stream.config import Config
from s3stream.errors import ConflictError, CorruptionError, InvalidArgumentError, NotFoundError
from s3stream.facade import SyncClient, SyncStream
from spark_sink.direct import read_committed_record
from spark_sink.protocol import (
    DISCARDED_RANGES_MAX,
    Committed,
    DiscardedRange,
    Progress,
    Writer,
    committed_key,
    load_progress,
    progress_key,
    writer_key,
)
from spark_sink.topic import Topic, describe_topic, open_partitions


class NothingToDiscardError(ConflictError):
    """The topic holds no record past its committed ends and no unfinished micro-batch: nothing to do."""


@dataclass(frozen=True, slots=True)
class PartitionState:
    """One partition as the tool found it."""

    partition: int
    stream_id: int
    committed_end: int
    stream_end: int

    @property
    def discard_count(self) -> int:
        """Records past the committed end (all of them are discarded)."""
        return self.stream_end - self.committed_end


@dataclass(frozen=True, slots=True)
class AbandonPlan:
    """What :func:`abandon_unfinished` changes: the KV records before and after."""

    topic: str
    partitions: tuple[PartitionState, ...]
    query_id: str | None
    """The query whose micro-batch is abandoned; None when no unfinished micro-batch was found
    (the records past the ends were appended outside the sink, or by a query the tool cannot name)."""
    progress: Progress | None
    """That query's progress record before (an unfinished batch)."""
    committed: Committed
    new_committed: Committed
    new_progress: Progress | None

    @property
    def discard_count(self) -> int:
        return sum(p.discard_count for p in self.partitions)

    def kv(self) -> dict[str, bytes]:
        """The KV records the tool writes, all in one ``append_atomic``."""
        out = {committed_key(self.topic): self.new_committed.encode()}
        if self.query_id is not None and self.new_progress is not None:
            out[progress_key(self.query_id, self.topic)] = self.new_progress.encode()
        return out

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary (the CLI's ``--json``)."""
        return {
            "topic": self.topic,
            "discard_records": self.discard_count,
            "partitions": [
                {
                    "partition": p.partition,
                    "stream_id": p.stream_id,
                    "committed_end": p.committed_end,
                    "stream_end": p.stream_end,
                    "discard_records": p.discard_count,
                    "discard_range": [p.committed_end, p.stream_end] if p.discard_count else None,
                }
                for p in self.partitions
            ],
            "query_id": self.query_id,
            "batch_id": None if self.progress is None else self.progress.batch_id,
            "chunks_done": None if self.progress is None else self.progress.chunks_done,
            "chunk_count": None if self.progress is None else self.progress.chunk_count,
        }


def plan_abandon(
    topic: str,
    committed: Committed,
    partitions: tuple[PartitionState, ...],
    *,
    query_id: str | None,
    progress: Progress | None,
) -> AbandonPlan:
    """The new committed and progress records that discard everything past the committed ends.

    ``query_id``/``progress`` name an unfinished micro-batch (or are None). Raises
    :class:`NothingToDiscardError` when no partition has records past its end and there is no
    unfinished batch; ``ConflictError`` when the record would hold more than
    :data:`~spark_sink.protocol.DISCARDED_RANGES_MAX` ranges; ``CorruptionError`` when a stream ends
    below its committed end.
    """
    assert (query_id is None) == (progress is None)
    assert progress is None or progress.unfinished
    assert [p.committed_end for p in partitions] == list(committed.ends)
    for p in partitions:
        if p.stream_end < p.committed_end:
            raise CorruptionError(
                f"topic {topic!r} partition {p.partition}: stream {p.stream_id} ends at {p.stream_end}, "
                f"below the committed end {p.committed_end}",
                source=f"kv:{committed_key(topic)}",
            )
    if not any(p.discard_count for p in partitions) and progress is None:
        raise NothingToDiscardError(
            f"topic {topic!r}: no partition holds records past its committed end and no micro-batch "
            "is unfinished: nothing to discard"
        )
    ranges = list(committed.discarded)
    for p in partitions:
        if not p.discard_count:
            continue
        last = max((i for i, r in enumerate(ranges) if r.partition == p.partition), default=None)
        if last is not None and ranges[last].end_offset == p.committed_end:
            ranges[last] = replace(ranges[last], end_offset=p.stream_end)  # adjacent: one range
        else:
            ranges.append(DiscardedRange(p.partition, p.committed_end, p.stream_end))
    ranges.sort(key=lambda r: (r.partition, r.start_offset))
    if len(ranges) > DISCARDED_RANGES_MAX:
        raise ConflictError(
            f"topic {topic!r}: discarding would leave {len(ranges)} discarded ranges in its committed "
            f"record, above {DISCARDED_RANGES_MAX}"
        )
    new_committed = Committed(
        tuple(p.stream_end for p in partitions), committed.query_id, committed.batch_id, tuple(ranges)
    )
    new_progress = None if progress is None else replace(progress, abandoned=True)
    return AbandonPlan(topic, partitions, query_id, progress, committed, new_committed, new_progress)


def abandon_unfinished(
    target: str | os.PathLike[str] | SyncClient,
    topic: str,
    *,
    query_id: str | None = None,
    dry_run: bool = False,
    bucket_uri: str | None = None,
    config: Config | None = None,
) -> AbandonPlan:
    """Discard what ``topic`` holds past its committed ends and abandon its unfinished micro-batch.

    ``target`` is the engine's data dir (opened here with ``bucket_uri``/``config``, as the sink
    does; refused while a sink holds it: ``ConflictError: data dir in use``) or an open client whose
    streams of the topic are not open (a live sink in this process: ``ConflictError``).
    ``query_id`` names the query of the unfinished micro-batch when the topic has no writer record
    (a batch written before it existed). ``dry_run`` only returns the plan. Returns the plan
    (applied unless ``dry_run``); raises :class:`NothingToDiscardError` when there is nothing to do.
    """
    if isinstance(target, SyncClient):
        client, owns = target, False
    elif not Path(target).is_dir():
        raise NotFoundError(f"data dir {os.fspath(target)!r} does not exist")  # opening would create it
    else:
        client, owns = open_sync(target, bucket_uri=bucket_uri, config=config), True
    try:
        described = describe_topic(client, topic)
        if described is None:
            raise NotFoundError(f"topic {topic!r} does not exist")
        streams = _open_streams(client, described)
        try:
            plan = _plan(client, described, streams, query_id)
            if not dry_run:
                client.append_atomic([], kv=plan.kv())
        finally:
            for s in streams:
                s.close()
    finally:
        if owns:
            client.close()
    return plan


def _open_streams(client: SyncClient, topic: Topic) -> list[SyncStream]:
    try:
        return open_partitions(client, topic)
    except ConflictError as exc:
        raise ConflictError(
            f"topic {topic.name!r}: its streams are open in this client ({exc}): a live sink (stop the "
            "query, close the sink) or a reader of this client; pass a client that has not opened them"
        ) from exc


def _plan(client: SyncClient, topic: Topic, streams: list[SyncStream], query_id: str | None) -> AbandonPlan:
    # the newer of the driver path's and the direct path's records
    committed = read_committed_record(client, topic.name, topic.partition_count)
    partitions = tuple(
        PartitionState(p, int(s.stream_id), committed.ends[p], s.next_offset) for p, s in enumerate(streams)
    )
    found, progress = _find_unfinished(client, topic.name, committed, query_id)
    return plan_abandon(topic.name, committed, partitions, query_id=found, progress=progress)


def _find_unfinished(
    client: SyncClient, topic: str, committed: Committed, query_id: str | None
) -> tuple[str | None, Progress | None]:
    """The query with an unfinished micro-batch on ``topic`` and its progress, or (None, None).

    Named by ``query_id``, else by the topic's writer record (the last multi-chunk micro-batch
    started), else by the committed record (the last query that completed one: a batch started
    before writer records existed).
    """
    if query_id is not None:
        progress = load_progress(client.kv.get, query_id, topic, committed)
        if progress is None:
            raise InvalidArgumentError(f"query {query_id!r} has no progress record")
        if not progress.unfinished:
            state = "already abandoned" if progress.abandoned else "complete"
            raise InvalidArgumentError(
                f"query {query_id!r}: its last micro-batch {progress.batch_id} is {state}, not unfinished"
            )
        return query_id, progress
    candidates: list[str] = []
    raw = client.kv.get(writer_key(topic))
    if raw is not None:
        candidates.append(Writer.decode(raw, key=writer_key(topic)).query_id)
    if committed.query_id and committed.query_id not in candidates:
        candidates.append(committed.query_id)
    for candidate in candidates:
        progress = load_progress(client.kv.get, candidate, topic, committed)
        if progress is not None and progress.unfinished:
            return candidate, progress
    return None, None
