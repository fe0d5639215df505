"""The direct path's commit side at scale, on real SQLite and PostgreSQL metadata and a real local bucket.

:class:`InProcessWriter` is the sink's :class:`~spark_sink.direct.DirectWriter` with its two Spark jobs
replaced by the executors' own functions run in this process over Arrow batches (one list per Spark
partition): the count and write passes, the object uploads, the id preparation and the one metadata
commit are the real ones. So a micro-batch of hundreds of tasks, a commit whose outcome is unknown and
a write pass that outlives its ids' TTL are checked without a Spark cluster's cost.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from s3stream.assembly import open_client
from s3stream.config import Config
from s3stream.engine.stream import Status
from s3stream.errors import ConflictError, InvalidArgumentError, UnavailableError
from s3stream.facade import SyncClient, SyncStream
from s3stream.ids import ObjectId
from s3stream.metadata.base import CommitObjectsRequest, MetadataStore, ObjectState
from s3stream.metadata.url import open_metadata_store
from spark_sink.direct import DirectStats, DirectWriter, describe
from spark_sink.direct_digest import DIGEST_COLUMN, rows_digest
from spark_sink.direct_protocol import (
    SLOTS_PER_TASK,
    ObjectDescription,
    OffsetPlan,
    SlotTable,
    TaskCount,
    direct_progress_key,
    task_assignments,
    tasks_per_prepare_call,
)
from spark_sink.direct_tasks import write_partition
from spark_sink.encode import PARTITION_COLUMN, TIMESTAMP_MS_COLUMN, EncodeOptions, check_rows
from spark_sink.kafka_codec import decode_batches

TOPIC = "t"
QUERY = "q"


def rows(keys: list[int], partitions: list[int]) -> pa.RecordBatch:
    """Normalized sink rows: key ``str(k)``, value ``k:v``, to the given topic partitions."""
    return pa.RecordBatch.from_pydict(
        {
            PARTITION_COLUMN: pa.array(partitions, pa.int32()),
            "key": pa.array([str(k).encode() for k in keys], pa.binary()),
            "value": pa.array([f"{k}:v".encode() for k in keys], pa.binary()),
            TIMESTAMP_MS_COLUMN: pa.array([1_700_000_000_000 + k for k in keys], pa.int64()),
        }
    )


@dataclass
class InMemoryBatch:
    """A micro-batch as the executors see it: Spark partition -> its Arrow batches. ``persist`` and
    ``unpersist`` stand in for the DataFrame's."""

    tasks: dict[int, list[pa.RecordBatch]]
    persisted: int = 0

    def persist(self, level: object) -> InMemoryBatch:
        self.persisted += 1
        return self

    def unpersist(self) -> InMemoryBatch:
        self.persisted -= 1
        return self


def tiny_batch(first_key: int, task_count: int, partitions: int) -> InMemoryBatch:
    """One row per task (task ``t`` to partition ``t % partitions``); every 50th task also writes the
    next partition (a StreamSet object)."""
    tasks: dict[int, list[pa.RecordBatch]] = {}
    for t in range(task_count):
        key = first_key + 2 * t
        if t % 50 == 0 and partitions > 1:
            tasks[t] = [rows([key, key + 1], [t % partitions, (t + 1) % partitions])]
        else:
            tasks[t] = [rows([key], [t % partitions])]
    return tasks_batch(tasks)


def tasks_batch(tasks: dict[int, list[pa.RecordBatch]]) -> InMemoryBatch:
    return InMemoryBatch(tasks)


class InProcessWriter(DirectWriter):
    """:class:`DirectWriter` with the count and write passes run here over an :class:`InMemoryBatch`."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.before_write_pass: Callable[[], None] = lambda: None
        self.write_passes = 0
        self.persisted: list[InMemoryBatch] = []

    def _persist(self, rows: Any) -> Any:
        """The batches with their row hashes (what ``with_digest`` adds in Spark), persisted."""
        hashed = {task: [with_row_hashes(rb) for rb in batches] for task, batches in rows.tasks.items()}
        persisted = InMemoryBatch(hashed)
        persisted.persist(None)
        self.persisted.append(persisted)
        return persisted

    def _count(self, rows: Any, encode: EncodeOptions) -> list[TaskCount]:
        """Per (task, partition): the records, payload bytes and row digest of the rows it writes."""
        out: list[TaskCount] = []
        for task, batches in rows.tasks.items():
            for rb in batches:
                assert check_rows(rb, encode) is None
            table = pa.Table.from_batches(batches)
            part = table.column(PARTITION_COLUMN)
            for p in sorted(pc.unique(part).to_pylist()):
                mine = table.filter(pc.equal(part, p))
                payload = sum(
                    len(k or b"") + len(v)
                    for k, v in zip(mine["key"].to_pylist(), mine["value"].to_pylist(), strict=True)
                )
                out.append(
                    TaskCount(task, p, mine.num_rows, payload, rows_digest(mine.column(DIGEST_COLUMN)))
                )
        return out

    def _write_objects(
        self, rows: Any, encode: EncodeOptions, plan: OffsetPlan, slots: SlotTable
    ) -> list[ObjectDescription]:
        self.write_passes += 1
        self.before_write_pass()
        options = self._options(encode, slots, task_assignments(plan, slots))
        return [
            describe(row)
            for task, batches in rows.tasks.items()
            for rb in write_partition(options, task, 0, iter(batches))
            for row in rb.to_pylist()
        ]


def with_row_hashes(rb: pa.RecordBatch) -> pa.RecordBatch:
    """``rb`` with :data:`DIGEST_COLUMN`: a 64-bit hash of each row's columns."""
    hashes = [
        int.from_bytes(hashlib.blake2b(repr(row).encode(), digest_size=8).digest(), "big", signed=True)
        for row in rb.to_pylist()
    ]
    return rb.append_column(DIGEST_COLUMN, pa.array(hashes, pa.int64()))


class DroppedCommitStore:
    """A real metadata store whose ``commit_objects`` of objects, once armed, raises UnavailableError
    after the real commit (``commit_first``) or instead of it: the two unknown outcomes of a connection
    that dropped during COMMIT. Everything else goes to the real store."""

    def __init__(self, inner: MetadataStore) -> None:
        self._inner = inner
        self.armed = False
        self.commit_first = True
        self.fail_releases = False
        """Release-only requests (no objects) raise UnavailableError without writing."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def commit_objects(self, request: CommitObjectsRequest) -> None:
        if self.fail_releases and not request.objects:
            raise UnavailableError("the store is away")
        if self.armed and request.objects:
            self.armed = False
            if self.commit_first:
                await self._inner.commit_objects(request)
            raise UnavailableError("server closed the connection unexpectedly (during COMMIT)")
        await self._inner.commit_objects(request)


@dataclass
class Topic:
    client: SyncClient
    streams: list[SyncStream]
    bucket_uri: str
    store: DroppedCommitStore
    observed: list[str]

    def writer(self, *, ttl_ms: int = 3_600_000) -> InProcessWriter:
        return InProcessWriter(
            client=self.client,
            topic=TOPIC,
            streams=self.streams,
            bucket_uri=self.bucket_uri,
            namespace=self.client.client.config.namespace,
            prepared_ttl_ms=ttl_ms,
            observer=self.observed.append,
        )

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.client.loop).result()

    def objects(self, state: ObjectState) -> list[Any]:
        return list(self.run(self.store.list_objects([state])))

    def ends(self) -> list[int]:
        return [int(self.run(self.store.describe_stream(s.stream_id)).end_offset) for s in self.streams]

    def read(self) -> dict[int, list[tuple[int, bytes]]]:
        """partition -> [(offset, key)] of everything committed, through the engine's read path."""
        out: dict[int, list[tuple[int, bytes]]] = {}
        for p, (stream, end) in enumerate(zip(self.streams, self.ends(), strict=True)):
            got = out.setdefault(p, [])
            pos = 0
            while pos < end:
                fetched = stream.fetch(pos, end, 1 << 20)
                assert fetched, f"partition {p}: nothing at offset {pos}"
                for b in fetched:
                    for kb in decode_batches(b.payload):
                        got.extend((o, k or b"") for o, k in zip(kb.offsets, kb.keys, strict=True))
                pos = fetched[-1].end_offset
        return out


def encode_options(batch_id: int, partitions: int) -> EncodeOptions:
    return EncodeOptions(
        batch_id=batch_id,
        partition_count=partitions,
        batch_bytes_target=8192,
        record_max_bytes=4096,
        partition_column="p",
    )


@contextmanager
def open_topic(tmp_path: Path, metadata_url: str, partitions: int) -> Iterator[Topic]:
    bucket_uri = (tmp_path / "objects").absolute().as_uri()
    holder: list[DroppedCommitStore] = []

    async def opener() -> Any:
        store = DroppedCommitStore(await open_metadata_store(metadata_url))
        holder.append(store)
        return await open_client(
            tmp_path / "data",
            bucket_uri=bucket_uri,
            config=Config(),
            metadata=store,
        )

    client = SyncClient.start(opener)
    store = holder[0]
    try:
        streams = [client.streams.create_and_open_stream() for _ in range(partitions)]
        yield Topic(client, streams, bucket_uri, store, [])
    finally:
        client.close()
        asyncio.run(store._inner.close())


@pytest.fixture(params=["sqlite", "postgresql"])
def metadata_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'metadata.db'}"
    url: str = request.getfixturevalue("pg_url")
    return url


def write(writer: InProcessWriter, batch: InMemoryBatch, batch_id: int, partitions: int) -> DirectStats:
    stats = writer.write(batch, encode_options(batch_id, partitions), query_id=QUERY)  # type: ignore[arg-type]
    assert all(p.persisted == 0 for p in writer.persisted), "every persisted micro-batch is unpersisted"
    return stats


# -- 1. a micro-batch of more tasks than one prepare call holds ----------------------------------------


TASKS = 704
"""More than one prepare call's worth of tasks (625 at 16 slots each): 11,264 ids, 10,560 unused."""
assert tasks_per_prepare_call(SLOTS_PER_TASK) < TASKS


def test_a_micro_batch_of_700_tasks_commits_once_and_releases_every_unused_id(
    tmp_path: Path, metadata_url: str
) -> None:
    partitions = 3
    with open_topic(tmp_path, metadata_url, partitions) as topic:
        writer = topic.writer()
        started = time.monotonic()
        stats = write(writer, tiny_batch(0, TASKS, partitions), 0, partitions)
        elapsed = time.monotonic() - started
        streamset = len(range(0, TASKS, 50))
        assert (stats.tasks, stats.objects, stats.rows) == (TASKS, TASKS, TASKS + streamset)
        assert stats.stream_objects == TASKS - streamset
        committed = topic.objects(ObjectState.COMMITTED)
        assert len(committed) == TASKS
        assert topic.objects(ObjectState.PREPARED) == [], "every unused slot's id is released"
        released = topic.objects(ObjectState.MARK_DESTROYED)
        assert len(released) == TASKS * SLOTS_PER_TASK - TASKS
        # every row once, offsets contiguous, in task order
        records = topic.read()
        keys = sorted(int(k) for recs in records.values() for _, k in recs)
        assert keys == sorted(
            k for t in range(TASKS) for k in ([2 * t, 2 * t + 1] if t % 50 == 0 else [2 * t])
        )
        for p, recs in records.items():
            assert [o for o, _ in recs] == list(range(len(recs))), f"partition {p}"
            assert [int(k) for _, k in recs] == sorted(int(k) for _, k in recs), "task order"
        assert sum(topic.ends()) == stats.rows
        # the replay commits nothing; the next batch continues
        assert write(writer, tiny_batch(0, TASKS, partitions), 0, partitions).skipped
        assert writer.write_passes == 1
        write(writer, tiny_batch(10 * TASKS, 3, partitions), 1, partitions)
        assert sum(topic.ends()) == stats.rows + 4  # task 0 writes two rows
        print(f"{TASKS} tasks on {metadata_url.split(':')[0]}: {elapsed:.1f} s")


# -- 2. a commit whose outcome is unknown, replayed in the same process --------------------------------


@pytest.mark.parametrize("commit_first", [True, False], ids=["committed", "not-committed"])
def test_a_commit_with_an_unknown_outcome_is_settled_by_the_replay_and_later_batches_go_on(
    tmp_path: Path, metadata_url: str, commit_first: bool
) -> None:
    partitions = 2
    with open_topic(tmp_path, metadata_url, partitions) as topic:
        writer = topic.writer()
        write(writer, tiny_batch(0, 4, partitions), 0, partitions)
        topic.store.armed, topic.store.commit_first = True, commit_first
        with pytest.raises(UnavailableError, match="during COMMIT"):
            write(writer, tiny_batch(100, 4, partitions), 1, partitions)
        assert {s.stream.handle.status for s in topic.streams} == {Status.RESERVED}
        with pytest.raises(ConflictError, match="reserved by an external commit"):
            topic.streams[0].append(_raw(b"refused"))
        # Spark replays batch 1 in the same process
        replay = write(writer, tiny_batch(100, 4, partitions), 1, partitions)
        assert replay.skipped is commit_first  # committed: the progress record says so
        assert writer.write_passes == (2 if commit_first else 3)
        assert {s.stream.handle.status for s in topic.streams} == {Status.OPEN}
        assert [s.next_offset for s in topic.streams] == topic.ends() == [4, 6]
        assert "settled" in topic.observed
        # later batches go on (stale handles would fail check_ends: "another writer appended")
        write(writer, tiny_batch(200, 4, partitions), 2, partitions)
        assert topic.ends() == [6, 9]
        keys = sorted(int(k) for recs in topic.read().values() for _, k in recs)
        assert keys == [0, 1, 2, 4, 6, 100, 101, 102, 104, 106, 200, 201, 202, 204, 206]
        # the lost attempt's ids (not committed) expire after their TTL, like a crashed driver's
        left = len(topic.objects(ObjectState.PREPARED))
        assert left == (0 if commit_first else 4 * SLOTS_PER_TASK)


def test_releases_after_a_commit_that_fail_leave_the_ids_to_expire_and_the_writer_goes_on(
    tmp_path: Path, metadata_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    with open_topic(tmp_path, metadata_url, 1) as topic:
        writer = topic.writer()
        first = int(topic.client.prepare_objects(5, ttl_ms=60_000))
        ids = [ObjectId(first + i) for i in range(5)]
        topic.store.fail_releases = True
        with caplog.at_level(logging.WARNING, logger="spark_sink.direct"):
            writer._release([ids[:3], ids[3:]], batch_id=7)  # the batch is committed: no error
        assert "micro-batch 7 is committed; releasing 5 unused object ids failed" in caplog.text
        assert len(topic.objects(ObjectState.PREPARED)) == 5
        topic.store.fail_releases = False
        writer._release([ids[:3], ids[3:]], batch_id=7)
        assert topic.objects(ObjectState.PREPARED) == []
        assert len(topic.objects(ObjectState.MARK_DESTROYED)) == 5


def test_settling_needs_no_round_trip_when_nothing_is_reserved(tmp_path: Path, metadata_url: str) -> None:
    with open_topic(tmp_path, metadata_url, 1) as topic:
        writer = topic.writer()
        assert writer.settle() == 0
        write(writer, tiny_batch(0, 2, 1), 0, 1)
        assert writer.settle() == 0
        assert "settled" not in topic.observed


def _raw(payload: bytes) -> Any:
    from s3stream.model import RecordBatch

    return RecordBatch(payload)


# -- 5. a write pass longer than the prepared ids' TTL ---------------------------------------------------


@pytest.mark.parametrize("swept", [True, False], ids=["ids-swept", "ids-not-swept-yet"])
def test_a_write_pass_longer_than_the_ttl_fails_naming_the_key_and_commits_nothing(
    tmp_path: Path, metadata_url: str, swept: bool
) -> None:
    """Whether or not the store's sweep has marked the ids destroyed yet (the commit would then fail
    with an unnamed NotFoundError, or succeed by chance), the micro-batch fails the same way."""
    partitions = 2
    with open_topic(tmp_path, metadata_url, partitions) as topic:
        short = topic.writer(ttl_ms=300)

        def slow_write_pass() -> None:
            time.sleep(0.5)
            if swept:  # the store's sweep runs meanwhile: the ids are marked destroyed, as GC would
                expired = topic.run(topic.store.expire_prepared(now_ms=int(time.time() * 1000) + 1_000))
                assert len(expired) == 3 * SLOTS_PER_TASK

        short.before_write_pass = slow_write_pass
        with pytest.raises(InvalidArgumentError, match=r"s3\.direct\.prepared\.ttl\.ms = 300 ms") as info:
            write(short, tiny_batch(0, 3, partitions), 0, partitions)
        assert "S3STREAM_S3_DIRECT_PREPARED_TTL_MS" in str(info.value)
        assert topic.ends() == [0, 0]
        assert topic.objects(ObjectState.COMMITTED) == []
        assert topic.run(topic.store.kv_get(direct_progress_key(QUERY, TOPIC))) is None
        assert {s.stream.handle.status for s in topic.streams} == {Status.OPEN}
        # the replay with a TTL above the write pass commits
        stats = write(topic.writer(ttl_ms=60_000), tiny_batch(0, 3, partitions), 0, partitions)
        assert not stats.skipped
        assert topic.ends() == [2, 2]


def test_the_sink_gives_its_direct_writer_the_direct_ttl_key(tmp_path: Path) -> None:
    from spark_sink.sink import S3StreamSink

    assert Config().direct_prepared_ttl_ms == 24 * 3_600_000
    env = {"S3STREAM_S3_DIRECT_PREPARED_TTL_MS": "5000"}
    config = Config.from_sources(env=env)
    assert (config.direct_prepared_ttl_ms, config.object_prepared_ttl_ms) == (5000, 3_600_000)
    uri = (tmp_path / "objects").absolute().as_uri()
    with S3StreamSink(tmp_path / "data", bucket_uri=uri, config=config, topic=TOPIC, direct=True) as sink:
        writer = sink._direct()
        assert writer is not None
        assert writer.prepared_ttl_ms == 5000
