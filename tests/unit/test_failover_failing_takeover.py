"""A takeover whose runs always fail ends: the taker gives its attempt back, the controller re-assigns
an attempt without progress, and after ``attempts_max`` attempts the takeover is FAILED, which frees
the one slot (another dead node is taken over) and lets the dead node register again (decision 0045).
Also the pure replay adjustments after a takeover (KV records a zombie wrote after a DONE takeover's
read are not applied; a FAILED takeover's handed-back streams replay the node's own batches)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest

from s3stream.cluster.controller import FailoverController, FailTakeover, ReassignTakeover
from s3stream.cluster.takeover import run_takeover
from s3stream.cluster.watcher import ClusterWatcher
from s3stream.engine.recovery import after_takeover
from s3stream.errors import UnavailableError
from s3stream.ids import NodeId, StreamId
from s3stream.metadata.base import RangeMetadata, StreamMetadata, StreamState, TakeoverInfo, TakeoverState
from s3stream.metadata.sqlite import SqliteMetadataStore
from s3stream.storage.local import LocalObjectStorage
from tests.support.configs import small_config
from tests.support.metadata_contract import FakeClock

LEASE_MS = 1000


async def test_a_takeover_that_always_fails_ends_failed_and_frees_the_slot(tmp_path: Path) -> None:
    clock = FakeClock()
    store = await SqliteMetadataStore.open(str(tmp_path / "m.db"), clock_ms=clock)
    storage = LocalObjectStorage(str(tmp_path / "objects"))
    dead = await store.open_node(node_id=NodeId(1), lease_ms=LEASE_MS, wal_path=str(tmp_path / "gone"))
    sid = await store.create_stream(node_id=NodeId(1), node_epoch=dead.node_epoch)
    await store.open_stream(node_id=NodeId(1), node_epoch=dead.node_epoch, stream_id=sid, epoch=0)
    other = await store.open_node(node_id=NodeId(3), lease_ms=LEASE_MS, wal_path="")
    o_sid = await store.create_stream(node_id=NodeId(3), node_epoch=other.node_epoch)
    await store.open_stream(node_id=NodeId(3), node_epoch=other.node_epoch, stream_id=o_sid, epoch=0)
    clock.advance(2 * LEASE_MS)  # nodes 1 and 3 lapse
    taker = await store.open_node(node_id=NodeId(2), lease_ms=600_000)
    controller = FailoverController(
        store, node_id=NodeId(2), poll_ms=10, clock_ms=clock, stall_ms=6 * LEASE_MS, attempts_max=3
    )
    assert await controller.scan_once() is not None  # fences 1, RUNNING with taker 2
    decisions = []
    for _ in range(20):
        (takeover,) = [t for t in await store.list_takeovers() if t.node_id == 1]
        if takeover.state is TakeoverState.FAILED:
            break
        if takeover.state is TakeoverState.RUNNING:
            with pytest.raises(UnavailableError):  # the WAL is unreachable
                await run_takeover(
                    takeover, metadata=store, storage=storage, config=small_config(node_id=NodeId(2)),
                    node_id=NodeId(2), node_epoch=taker.node_epoch,
                )  # fmt: skip
        clock.advance(10 * LEASE_MS)  # no progress reported: past the deadline
        await store.heartbeat(node_id=NodeId(2), node_epoch=taker.node_epoch, lease_ms=600_000)
        decisions.append(await controller.scan_once())
    assert [type(d) for d in decisions] == [ReassignTakeover, ReassignTakeover, FailTakeover]
    (failed,) = [t for t in await store.list_takeovers() if t.node_id == 1]
    assert (failed.state, failed.attempt) == (TakeoverState.FAILED, 3)
    # the slot is free: node 3 is taken over next; node 1 (FAILED) is not started again
    started = await controller.scan_once()
    assert started is not None
    assert started.node_id == 3
    again = await store.open_node(node_id=NodeId(1), lease_ms=LEASE_MS)  # the dead node comes back
    opening = await store.register_node(node_id=NodeId(1), node_epoch=again.node_epoch)
    assert [m.stream_id for m in opening] == [sid]
    await store.close()


class FailingRunner:
    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, takeover: TakeoverInfo) -> list[StreamId]:
        self.calls += 1
        raise UnavailableError("the WAL volume does not attach")


async def test_the_taker_gives_an_attempt_back_after_its_failures(tmp_path: Path) -> None:
    clock = FakeClock()
    store = await SqliteMetadataStore.open(str(tmp_path / "m.db"), clock_ms=clock)
    dead = await store.open_node(node_id=NodeId(1), lease_ms=LEASE_MS)
    sid = await store.create_stream(node_id=NodeId(1), node_epoch=dead.node_epoch)
    await store.open_stream(node_id=NodeId(1), node_epoch=dead.node_epoch, stream_id=sid, epoch=0)
    clock.advance(LEASE_MS)
    taker = await store.open_node(node_id=NodeId(2), lease_ms=600_000)
    await store.start_takeover(
        node_id=NodeId(1),
        node_epoch=dead.node_epoch,
        taker_node_id=NodeId(2),
        taker_node_epoch=taker.node_epoch,
    )

    class EngineStub:
        node_id = NodeId(2)
        node_epoch = taker.node_epoch
        fenced = False
        streams: ClassVar[dict[int, object]] = {}

    from s3stream.cluster.events import AssignmentHub

    now = [0.0]
    runner = FailingRunner()
    watcher = ClusterWatcher(
        EngineStub(), store, AssignmentHub(), poll_ms=10, takeover_runner=runner,  # type: ignore[arg-type]
        clock=lambda: now[0], run_failures_max=3,
    )  # fmt: skip
    for _ in range(6):
        await watcher.poll_once()
        for task in list(watcher._runs.values()):
            await task
        now[0] += 10.0
    assert runner.calls == 3
    (takeover,) = await store.list_takeovers()
    assert (takeover.state, takeover.taker_node_id, takeover.attempt) == (TakeoverState.PENDING, -1, 1)
    await store.close()


def stream(sid: int, epoch: int, node_id: int) -> StreamMetadata:
    ranges = (RangeMetadata(StreamId(sid), epoch, 0, 0, 0, NodeId(node_id)),)
    return StreamMetadata(StreamId(sid), epoch, 0, 0, StreamState.OPENED, ranges)


def takeover(state: TakeoverState, *, wal_end_offset: int = -1) -> TakeoverInfo:
    return TakeoverInfo(
        node_id=NodeId(1), node_epoch=1, fence_epoch=2, wal_path="", streams=((StreamId(5), 0),),
        state=state, taker_node_id=-1, taker_node_epoch=-1, attempt=1, created_at_ms=0,
        updated_at_ms=0, wal_end_offset=wal_end_offset,
    )  # fmt: skip


def test_after_a_done_takeover_kv_records_past_the_takers_read_are_not_applied() -> None:
    done = takeover(TakeoverState.DONE, wal_end_offset=10)
    voided = after_takeover(done, [], kv_applied_offset=9, wal_end_offset=14)
    assert voided.kv_applied_offset == 13
    # a later session applied records (the mark moved): its own records replay normally
    assert after_takeover(done, [], kv_applied_offset=11, wal_end_offset=14).kv_applied_offset == 11
    assert after_takeover(done, [], kv_applied_offset=9, wal_end_offset=10).kv_applied_offset == 9
    assert after_takeover(None, [], kv_applied_offset=3, wal_end_offset=14).kv_applied_offset == 3


def test_after_a_failed_takeover_handed_back_streams_keep_the_fence_epochs_batches() -> None:
    failed = takeover(TakeoverState.FAILED)
    adjust = after_takeover(
        failed, [stream(5, 2, 1), stream(6, 0, 1)], kv_applied_offset=-1, wal_end_offset=4
    )
    assert adjust.handed_back == {5: 0}
    assert after_takeover(failed, [stream(5, 0, 1)], kv_applied_offset=-1, wal_end_offset=4).handed_back == {}
