"""A taker runs every takeover assigned to it, including a second takeover of the same node (a later
session of it that died too), whose attempt number starts at 1 again.

Found by the cluster soak (seed 3): a node killed, restarted, then paused past its lease got a second
takeover given to the taker of its first one; the watcher took it for the first one's finished run
and never ran it, so it stayed RUNNING and the node could not open again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from s3stream.assembly import build_reader
from s3stream.cluster.events import AssignmentHub
from s3stream.cluster.watcher import ClusterWatcher
from s3stream.engine.core import Engine
from s3stream.ids import NodeId, StreamId
from s3stream.metadata.base import TakeoverInfo, TakeoverState
from s3stream.metadata.memory import MemoryMetadataStore
from s3stream.storage.memory import MemoryObjectStorage
from tests.unit.test_engine import SMALL
from tests.unit.test_engine_append_path import ReorderingWal

CONFIG = SMALL.replace(cluster_poll_ms=10)
TAKER = NodeId(1)
DEAD = NodeId(2)
DEAD_LEASE_MS = 100


async def _dead_session_owning_a_stream(metadata: MemoryMetadataStore) -> int:
    """Node 2 opens a session, opens a new stream, and lets its lease lapse; returns the session's epoch."""
    info = await metadata.open_node(node_id=DEAD, lease_ms=DEAD_LEASE_MS)
    stream_id = await metadata.create_stream(node_id=DEAD, node_epoch=info.node_epoch)
    await metadata.open_stream(node_id=DEAD, node_epoch=info.node_epoch, stream_id=stream_id, epoch=0)
    await asyncio.sleep(2 * DEAD_LEASE_MS / 1000)
    return info.node_epoch


async def _wait_done(metadata: MemoryMetadataStore, node_epoch: int, timeout_s: float = 5.0) -> TakeoverInfo:
    async with asyncio.timeout(timeout_s):
        while True:
            rows = [
                t for t in await metadata.list_takeovers() if t.node_id == DEAD and t.node_epoch == node_epoch
            ]
            if rows and rows[-1].state is TakeoverState.DONE:
                return rows[-1]
            await asyncio.sleep(0.01)


async def test_a_second_takeover_of_the_same_node_with_the_same_attempt_number_is_run() -> None:
    metadata, storage = MemoryMetadataStore(), MemoryObjectStorage()
    taker = await metadata.open_node(node_id=TAKER, lease_ms=60_000)
    engine = Engine(
        CONFIG,
        wal=ReorderingWal(),
        metadata=metadata,
        storage=storage,
        node_id=TAKER,
        node_epoch=taker.node_epoch,
        reader=build_reader(CONFIG, metadata, storage),
    )
    await engine.start()
    runs: list[tuple[int, int, int]] = []

    async def runner(takeover: TakeoverInfo) -> Sequence[StreamId]:
        """The taker's metadata steps without a WAL: take the streams over, finish."""
        runs.append((int(takeover.node_id), takeover.node_epoch, takeover.attempt))
        dead, epoch = takeover.node_id, taker.node_epoch
        taken = await metadata.takeover_streams(node_id=dead, taker_node_id=TAKER, taker_node_epoch=epoch)
        await metadata.finish_takeover(
            node_id=dead, taker_node_id=TAKER, taker_node_epoch=epoch, wal_end_offset=0
        )
        return [meta.stream_id for meta, _ in taken]

    watcher = ClusterWatcher(engine, metadata, AssignmentHub(), poll_ms=10, takeover_runner=runner)
    watcher.start()
    try:
        for _ in range(2):
            dead_epoch = await _dead_session_owning_a_stream(metadata)
            started = await metadata.start_takeover(
                node_id=DEAD, node_epoch=dead_epoch, taker_node_id=TAKER, taker_node_epoch=taker.node_epoch
            )
            assert (started.state, started.attempt) == (TakeoverState.RUNNING, 1)
            await _wait_done(metadata, dead_epoch)
        assert [(node, attempt) for node, _, attempt in runs] == [(DEAD, 1), (DEAD, 1)]
        assert runs[0][1] < runs[1][1]
    finally:
        await watcher.close()
        await engine.close()
