"""GC over several buckets follows from MultiBucketStorage's delete and list: the prepared-object
reaper deletes an uncommitted object from every bucket, GC retries a bucket that was down, and the
reclaim of what killed writers leave runs in every bucket."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from compaction.gc import GarbageCollector, PreparedObjectReaper
from s3stream.buckets.health import BucketHealth
from s3stream.buckets.storage import MultiBucketStorage
from s3stream.buckets.strategy import make_strategy
from s3stream.errors import UnavailableError
from s3stream.metadata.base import ObjectState
from s3stream.storage.base import ObjectStorage
from s3stream.storage.local import LocalObjectStorage
from tests.support.buckets import NAMESPACE, make_rig


class Clock:
    def __init__(self) -> None:
        self.now_ms = int(time.time() * 1000)

    def __call__(self) -> int:
        return self.now_ms


async def test_the_reaper_deletes_an_uncommitted_replicated_object_from_every_bucket() -> None:
    rig = make_rig("replication")
    clock = Clock()
    object_id = await rig.metadata.prepare_objects(count=1, ttl_ms=1000)
    from s3stream.objectformat.keys import object_key

    key = object_key(object_id, NAMESPACE)
    upload = rig.storage.upload(key)
    await upload.write(b"never committed")
    await upload.complete()  # the writer dies here: the object stays PREPARED
    assert rig.holders(key) == [0, 1]
    collector = GarbageCollector(
        rig.metadata, rig.storage, namespace=NAMESPACE, retention_ms=0, orphan_ttl_ms=0, clock_ms=clock
    )
    reaper = PreparedObjectReaper(collector)
    clock.now_ms += 2000
    rig.fail(1, "delete")  # one bucket down: the bytes stay marked, nothing is forgotten
    with pytest.raises(UnavailableError):
        await reaper.run_once()
    assert rig.holders(key) == [1]
    assert [o.object_id for o in await rig.metadata.list_objects([ObjectState.MARK_DESTROYED])] == [object_id]
    rig.heal(1)
    assert await reaper.run_once() == [object_id]
    assert rig.holders(key) == []
    assert await rig.metadata.list_objects() == []
    assert await rig.metadata.placements([object_id]) == {}


async def test_reclaiming_what_killed_writers_left_covers_every_bucket(tmp_path: Path) -> None:
    buckets: dict[int, ObjectStorage] = {b: LocalObjectStorage(str(tmp_path / f"b{b}")) for b in (0, 1)}
    storage = MultiBucketStorage(
        buckets, strategy=make_strategy("round_robin", (0, 1), None), health=BucketHealth((0, 1))
    )
    try:
        old = time.time() - 7200
        for b in (0, 1):
            (tmp_path / f"b{b}").mkdir(exist_ok=True)
            stale = tmp_path / f"b{b}" / ".obj~0123456789abcdef0123456789abcdef"
            stale.write_bytes(b"partial")
            os.utime(stale, (old, old))
        assert await storage.abort_incomplete_uploads(older_than_s=3600) == 2
        assert not any(p.name.startswith(".") for b in (0, 1) for p in (tmp_path / f"b{b}").iterdir())
    finally:
        await storage.close()


async def test_gc_keeps_an_object_placed_in_a_bucket_this_node_does_not_know() -> None:
    rig = make_rig("failover")  # knows 0 and 1; another node's newer list wrote the object to bucket 2
    clock = Clock()
    object_id = await rig.metadata.prepare_objects(count=1, ttl_ms=1000)
    await rig.metadata.record_placement(object_id, [2])
    collector = GarbageCollector(
        rig.metadata, rig.storage, namespace=NAMESPACE, retention_ms=0, orphan_ttl_ms=0, clock_ms=clock
    )
    clock.now_ms += 2000
    with pytest.raises(UnavailableError, match=r"\[2\]"):
        await PreparedObjectReaper(collector).run_once()
    assert [o.object_id for o in await rig.metadata.list_objects([ObjectState.MARK_DESTROYED])] == [object_id]
    assert await rig.metadata.placements([object_id]) == {object_id: (2,)}
