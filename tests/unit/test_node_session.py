"""The node session in the client: heartbeat renewals and fencing, the maintenance election, the orphan rule."""

from __future__ import annotations

from pathlib import Path

import pytest

from compaction.gc import orphan_keys
from compaction.maintenance import MAINTENANCE_LEASE, MaintenanceElection
from s3stream import RecordBatch
from s3stream.assembly import open_client, open_session
from s3stream.config import Config
from s3stream.engine.heartbeat import Heartbeat
from s3stream.errors import ErrorCode, FencedError
from s3stream.ids import NodeId, ObjectId
from s3stream.metadata.memory import MemoryMetadataStore
from s3stream.storage.memory import MemoryObjectStorage

LEASE_MS = 1000
N1, N2 = NodeId(1), NodeId(2)


class Clocks:
    """The store's wall clock (ms) and the node's monotonic clock (s), moved together by tests."""

    def __init__(self) -> None:
        self.ms = 1_000_000

    def wall_ms(self) -> int:
        return self.ms

    def mono_s(self) -> float:
        return self.ms / 1000

    def advance(self, ms: int) -> None:
        self.ms += ms


@pytest.fixture
def clocks() -> Clocks:
    return Clocks()


async def heartbeat_of(store: MemoryMetadataStore, clocks: Clocks, node_id: NodeId = N1) -> Heartbeat:
    opened_at_s = clocks.mono_s()
    info = await store.open_node(node_id=node_id, lease_ms=LEASE_MS)
    return Heartbeat(
        store,
        node_id=node_id,
        node_epoch=info.node_epoch,
        lease_ms=LEASE_MS,
        opened_at_s=opened_at_s,
        clock=clocks.mono_s,
    )


async def test_a_renewal_moves_the_lease_deadline_to_its_send_time_plus_the_lease(clocks: Clocks) -> None:
    store = MemoryMetadataStore(clock_ms=clocks.wall_ms)
    heartbeat = await heartbeat_of(store, clocks)
    assert heartbeat.lease_deadline_s == clocks.mono_s() + LEASE_MS / 1000
    clocks.advance(600)
    await heartbeat.renew_once()
    assert heartbeat.lease_deadline_s == clocks.mono_s() + LEASE_MS / 1000
    clocks.advance(900)  # past the first lease, within the renewed one
    assert heartbeat.holds_lease()
    assert heartbeat.fenced is None


async def test_a_newer_open_of_the_node_fences_the_session_at_its_next_renewal(clocks: Clocks) -> None:
    store = MemoryMetadataStore(clock_ms=clocks.wall_ms)
    heartbeat = await heartbeat_of(store, clocks)
    told: list[FencedError] = []
    heartbeat.add_listener(told.append)
    newer = await store.open_node(node_id=N1, lease_ms=LEASE_MS)
    assert newer.node_epoch == heartbeat.node_epoch + 1
    with pytest.raises(FencedError):
        await heartbeat.renew_once()
    assert len(told) == 1
    assert told[0].code == ErrorCode.NODE_FENCED
    with pytest.raises(FencedError):
        await heartbeat.renew_once()  # stays fenced; listeners are told once
    assert len(told) == 1
    late: list[FencedError] = []
    heartbeat.add_listener(late.append)  # a listener added after the fence is told at once
    assert late == told


async def test_a_lease_not_renewed_before_its_end_fences_the_node_without_asking_the_store(
    clocks: Clocks,
) -> None:
    store = MemoryMetadataStore(clock_ms=clocks.wall_ms)
    heartbeat = await heartbeat_of(store, clocks)
    told: list[FencedError] = []
    heartbeat.add_listener(told.append)
    clocks.advance(LEASE_MS - 1)
    assert heartbeat.holds_lease()
    clocks.advance(1)
    assert not heartbeat.holds_lease()
    assert len(told) == 1
    with pytest.raises(FencedError):
        await heartbeat.renew_once()  # an expired lease is never revived
    # The store agrees: the session expired there too.
    with pytest.raises(FencedError):
        await store.heartbeat(node_id=N1, node_epoch=heartbeat.node_epoch, lease_ms=LEASE_MS)


async def test_close_ends_a_healthy_session_and_leaves_a_fenced_one_alone(clocks: Clocks) -> None:
    store = MemoryMetadataStore(clock_ms=clocks.wall_ms)
    heartbeat = await heartbeat_of(store, clocks)
    await heartbeat.close()
    with pytest.raises(FencedError):  # the session ended at close
        await store.heartbeat(node_id=N1, node_epoch=heartbeat.node_epoch, lease_ms=LEASE_MS)
    fenced = await heartbeat_of(store, clocks)
    newest = await store.open_node(node_id=N1, lease_ms=LEASE_MS)
    fenced.fence(FencedError("bumped", code=ErrorCode.NODE_FENCED))
    await fenced.close()
    (info,) = await store.list_nodes()
    assert info.node_epoch == newest.node_epoch
    assert info.lease_expires_at_ms == clocks.wall_ms() + LEASE_MS  # the newest session is untouched


class CountingJob:
    def __init__(self) -> None:
        self.starts = 0
        self.closes = 0

    def start(self) -> None:
        self.starts += 1

    async def close(self) -> None:
        self.closes += 1


async def election_of(
    store: MemoryMetadataStore, clocks: Clocks, node_id: NodeId
) -> tuple[MaintenanceElection, CountingJob]:
    info = await store.open_node(node_id=node_id, lease_ms=LEASE_MS)
    job = CountingJob()
    election = MaintenanceElection(
        store, node_id=node_id, node_epoch=info.node_epoch, lease_ms=LEASE_MS, jobs=[job], clock=clocks.mono_s
    )
    return election, job


async def test_only_the_lease_holder_runs_the_jobs_and_another_node_takes_over_when_it_ends(
    clocks: Clocks,
) -> None:
    store = MemoryMetadataStore(clock_ms=clocks.wall_ms)
    a, a_job = await election_of(store, clocks, N1)
    b, b_job = await election_of(store, clocks, N2)
    assert await a.elect_once()
    assert not await b.elect_once()
    assert (a_job.starts, b_job.starts) == (1, 0)
    clocks.advance(400)
    assert await a.elect_once()  # a renewal: the jobs keep running
    assert a_job.starts == 1
    await store.close_node(node_id=N1, node_epoch=a.node_epoch)  # A's session ends: its lease with it
    assert await b.elect_once()
    assert b_job.starts == 1
    assert not await a.elect_once()
    assert a_job.closes == 1
    lease = await store.get_lease(MAINTENANCE_LEASE)
    assert lease is not None
    assert lease.node_id == N2


async def test_the_holder_stops_its_jobs_when_it_cannot_renew_before_the_lease_ends(clocks: Clocks) -> None:
    store = MemoryMetadataStore(clock_ms=clocks.wall_ms)
    a, a_job = await election_of(store, clocks, N1)
    assert await a.elect_once()
    await store.close()  # the store is unreachable from now on
    clocks.advance(LEASE_MS // 2)
    assert await a.elect_once()  # a failed renewal within the lease: keeps running
    assert a_job.closes == 0
    clocks.advance(LEASE_MS // 2)
    assert not await a.elect_once()
    assert a_job.closes == 1


async def test_a_fenced_node_stops_its_jobs_and_never_runs_them_again(clocks: Clocks) -> None:
    store = MemoryMetadataStore(clock_ms=clocks.wall_ms)
    a, a_job = await election_of(store, clocks, N1)
    assert await a.elect_once()
    await store.open_node(node_id=N1, lease_ms=LEASE_MS)  # a newer session of node 1
    assert not await a.elect_once()
    assert a_job.closes == 1
    assert not await a.elect_once()
    assert a_job.starts == 1


def test_the_orphan_rule_keeps_known_ids_and_ids_at_or_above_the_next_object_id() -> None:
    candidates = [(1, "k1"), (2, "k2"), (5, "k5"), (9, "k9")]
    known = {ObjectId(2)}
    assert orphan_keys(candidates, known, next_object_id=9) == ["k1", "k5"]
    assert orphan_keys(candidates, known, next_object_id=3) == ["k1"]
    assert orphan_keys(candidates, {ObjectId(i) for i in range(10)}, next_object_id=10) == []


async def test_a_session_whose_lease_expired_in_the_store_cannot_commit_an_upload(
    tmp_path: Path, clocks: Clocks
) -> None:
    store = MemoryMetadataStore(clock_ms=clocks.wall_ms)
    storage = MemoryObjectStorage()
    config = Config(
        wal_capacity_bytes=4 << 20,
        wal_record_max_bytes=1 << 20,
        record_max_bytes=1 << 20,
        node_lease_ms=60_000,
    )
    client = await open_client(tmp_path, config=config, metadata=store, storage=storage)
    try:
        stream = await client.streams.create_and_open_stream()
        assert await stream.append(RecordBatch(b"up")) == 0
        await client.engine.force_upload(None)
        keys = {info.key async for info in storage.list("")}
        assert await stream.append(RecordBatch(b"stays in the WAL")) == 1
        clocks.advance(60_000)  # the store sees the lease end; the node's own clock has not moved
        assert not client.engine.fenced
        with pytest.raises(FencedError) as refused:
            await client.engine.force_upload(None)
        assert refused.value.code == ErrorCode.NODE_FENCED
        assert client.engine.fenced
        with pytest.raises(FencedError):
            await stream.append(RecordBatch(b"refused"))
        assert {info.key async for info in storage.list("")} == keys
    finally:
        await client.close()


async def test_open_session_binds_the_store_to_the_new_epoch(clocks: Clocks) -> None:
    store = MemoryMetadataStore(clock_ms=clocks.wall_ms)
    first = await open_session(store, node_id=N1, lease_ms=LEASE_MS)
    second = await open_session(store, node_id=N1, lease_ms=LEASE_MS)
    try:
        assert second.node_epoch == first.node_epoch + 1
        assert store.bound_session == (N1, second.node_epoch)
    finally:
        await first.close()
        await second.close()


async def test_the_maintenance_node_compacts_another_nodes_stream_set_objects_for_that_node(
    tmp_path: Path,
) -> None:
    from compaction.compactor import Compactor

    config = Config(
        wal_capacity_bytes=4 << 20,
        wal_record_max_bytes=1 << 20,
        record_max_bytes=1 << 20,
        metadata_url=f"sqlite://{tmp_path / 'metadata.db'}",
    )
    bucket = f"file://{tmp_path / 'objects'}"
    maintainer = await open_client(tmp_path / "m", bucket_uri=bucket, config=config.replace(node_id=1))
    writer = await open_client(tmp_path / "w", bucket_uri=bucket, config=config.replace(node_id=2))
    try:
        assert maintainer.components["maintenance"].running  # type: ignore[attr-defined]
        assert not writer.components["maintenance"].running  # type: ignore[attr-defined]
        streams = [await writer.streams.create_and_open_stream() for _ in range(2)]
        for round_ in range(3):  # three uploads -> three StreamSet objects of node 2
            for s in streams:
                await s.append(RecordBatch(b"%d-%d" % (s.stream_id, round_)))
            await writer.engine.force_upload(None)
        metadata = writer.engine.metadata
        assert len(await metadata.get_stream_set_objects(N2)) == 3
        compactor = maintainer.components["compactor"]
        assert isinstance(compactor, Compactor)
        report = await compactor.run_once()
        assert report.stream_set_objects_compacted == 3
        assert len(await metadata.get_stream_set_objects(N2)) == 1  # still node 2's
        assert await metadata.get_stream_set_objects(N1) == []
        writer.engine.cache.try_real_free(target_bytes=0)
        for s in streams:
            got = await s.fetch(0, 3)
            assert [b.payload for b in got] == [b"%d-%d" % (s.stream_id, r) for r in range(3)]
        # The writer is not the maintenance node: its compactor's writes are refused by the store.
        with pytest.raises(FencedError):
            await writer.components["compactor"].run_once()  # type: ignore[attr-defined]
    finally:
        await writer.close()
        await maintainer.close()


async def test_the_heartbeats_fence_stops_the_maintenance_jobs_at_once(clocks: Clocks) -> None:
    store = MemoryMetadataStore(clock_ms=clocks.wall_ms)
    heartbeat = await heartbeat_of(store, clocks)
    job = CountingJob()
    election = MaintenanceElection(
        store,
        node_id=N1,
        node_epoch=heartbeat.node_epoch,
        lease_ms=LEASE_MS,
        jobs=[job],
        clock=clocks.mono_s,
    )
    heartbeat.add_listener(election.on_fenced)
    assert await election.elect_once()
    clocks.advance(LEASE_MS)
    assert not heartbeat.holds_lease()  # fences: the election is told
    await election.close()
    assert (job.starts, job.closes) == (1, 1)
    assert not election.running
    assert not await election.elect_once()  # never again in this session


async def test_a_data_dir_from_wall_clock_epochs_opens_with_the_next_epoch(tmp_path: Path) -> None:
    from s3stream.assembly import WAL_FILE, open_block_wal
    from s3stream.metadata.sqlite import SqliteMetadataStore

    config = Config(wal_capacity_bytes=4 << 20, wal_record_max_bytes=1 << 20, record_max_bytes=1 << 20)
    legacy_epoch = 1_764_000_000_000  # a start time in ms, as node epochs used to be
    store = await SqliteMetadataStore.open(str(tmp_path / "metadata.db"))
    await store.register_node(node_id=NodeId(0), node_epoch=legacy_epoch)
    await store.close()
    wal = await open_block_wal(tmp_path / WAL_FILE, config, node_epoch=legacy_epoch)
    await wal.recover()
    await wal.close()
    client = await open_client(tmp_path, config=config)
    try:
        assert client.engine.node_epoch == legacy_epoch + 1
    finally:
        await client.close()


async def test_a_stream_operation_refused_for_the_session_fences_the_engine(
    tmp_path: Path, clocks: Clocks
) -> None:
    store = MemoryMetadataStore(clock_ms=clocks.wall_ms)
    config = Config(
        wal_capacity_bytes=4 << 20,
        wal_record_max_bytes=1 << 20,
        record_max_bytes=1 << 20,
        node_lease_ms=60_000,
    )
    client = await open_client(tmp_path, config=config, metadata=store, storage=MemoryObjectStorage())
    try:
        stream = await client.streams.create_and_open_stream()
        await store.open_node(node_id=NodeId(0), lease_ms=60_000)  # a newer session of this node
        with pytest.raises(FencedError):
            await client.streams.create_stream()
        assert client.engine.fenced
        with pytest.raises(FencedError):
            await stream.append(RecordBatch(b"refused"))
    finally:
        await client.close()


async def test_a_fence_while_the_acquire_is_in_flight_starts_no_job(clocks: Clocks) -> None:
    store = MemoryMetadataStore(clock_ms=clocks.wall_ms)
    election, job = await election_of(store, clocks, N1)
    real_acquire = store.acquire_lease

    async def acquire_then_fenced(**kwargs: object) -> object:
        lease = await real_acquire(**kwargs)  # type: ignore[arg-type]
        election.on_fenced(FencedError("lease lost locally", code=ErrorCode.NODE_FENCED))
        return lease

    store.acquire_lease = acquire_then_fenced  # type: ignore[method-assign]
    assert not await election.elect_once()
    assert job.starts == 0
    await election.close()


async def test_the_reaper_starts_once_and_close_detaches_its_task() -> None:
    from compaction.gc import GarbageCollector, PreparedObjectReaper

    store = MemoryMetadataStore()
    reaper = PreparedObjectReaper(
        GarbageCollector(store, MemoryObjectStorage(), namespace="ns", retention_ms=0, orphan_ttl_ms=0)
    )
    reaper.start()
    first = reaper._task
    reaper.start()  # a second start while it runs: the same loop
    assert reaper._task is first
    await reaper.close()
    assert reaper._task is None
    assert first is not None
    assert first.done()
