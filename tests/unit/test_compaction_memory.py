"""Compaction's memory arithmetic: the uploads that could hold more than compaction's own buffers are
given their share of the budget as ``buffer_max_bytes`` (StreamSet object: the reserve R; stream
object merges: budget - 2 x copy threshold; a step's stream objects hold only step bytes and get
none), and 2 S + R never exceeds the budget."""

from __future__ import annotations

import random
import time

import pytest

from compaction.plan import CompactionLimits
from s3stream.config import Config
from s3stream.metadata.base import ObjectKind
from s3stream.objectformat import object_key
from s3stream.storage.base import Upload
from s3stream.storage.memory import MemoryObjectStorage
from tests.unit import test_compaction as base

MiB = 1024 * 1024


class RecordingStorage(MemoryObjectStorage):
    """The memory twin, remembering the ``buffer_max_bytes`` each upload was started with."""

    def __init__(self) -> None:
        super().__init__()
        self.limits: dict[str, int | None] = {}

    def upload(self, key: str, *, buffer_max_bytes: int | None = None) -> Upload:
        self.limits[key] = buffer_max_bytes
        return super().upload(key, buffer_max_bytes=buffer_max_bytes)


@pytest.mark.parametrize("budget_mib", [1, 10, 32, 64, 200, 1024])
@pytest.mark.parametrize("part_mib", [5, 16])
def test_two_steps_and_the_reserve_fit_the_budget(budget_mib: int, part_mib: int) -> None:
    config = Config(
        stream_set_object_compaction_cache_size_bytes=budget_mib * MiB, object_part_size_bytes=part_mib * MiB
    )
    limits = CompactionLimits.from_config(config)
    assert 2 * limits.step_max_bytes + limits.writer_buffer_max_bytes <= limits.memory_budget_bytes


async def _env_with(
    storage: RecordingStorage, *, split_bytes: int
) -> tuple[base.Env, base.Client, list[base.Stream]]:
    env = base.Env(base.CONFIG.replace(stream_set_object_compaction_stream_split_size_bytes=split_bytes))
    env.storage = storage
    client = await env.open()
    streams = [await client.streams.create_and_open_stream() for _ in range(4)]
    await base.fill(client, streams, 6, random.Random(3))
    return env, client, streams


async def test_stream_set_compaction_gives_each_upload_its_share() -> None:
    storage = RecordingStorage()
    # the four streams hold 21-28 KB each: two are split into stream objects, two stay in the StreamSet object
    env, client, streams = await _env_with(storage, split_bytes=25 * 1024)
    before = await base.snapshot(streams)
    storage.limits.clear()
    compactor = env.compactor()
    report = await compactor.run_once()
    assert report.problems == ()
    kinds = {object_key(o.object_id, env.config.namespace): o.kind for o in await env.metadata.list_objects()}
    by_kind: dict[ObjectKind, set[int | None]] = {}
    for key, limit in storage.limits.items():
        by_kind.setdefault(kinds[key], set()).add(limit)
    limits = compactor.limits
    assert by_kind == {
        ObjectKind.STREAM_SET: {limits.writer_buffer_max_bytes},
        ObjectKind.STREAM: {None},  # they hold only step bytes (at most S): no limit
    }
    assert await base.snapshot(streams) == before
    await client.close()


async def test_force_split_and_stream_object_merge_give_their_uploads_a_share() -> None:
    storage = RecordingStorage()
    env, client, streams = await _env_with(storage, split_bytes=1)
    before = await base.snapshot(streams)
    later = int(time.time() * 1000) + 3 * 3600_000
    storage.limits.clear()
    compactor = env.compactor(clock_ms=lambda: later)
    report = await compactor.run_once()
    assert report.force_split_count > 0
    assert set(storage.limits.values()) == {None}  # stream objects only
    storage.limits.clear()
    compactor.stream_objects.copy_size_min_bytes = 100 * 1024
    report = await compactor.run_once(stream_objects=True)
    assert report.stream_objects_written > 0
    expected = env.config.stream_set_object_compaction_cache_size_bytes - 2 * 100 * 1024
    assert set(storage.limits.values()) == {expected}
    assert await base.snapshot(streams) == before
    await client.close()
