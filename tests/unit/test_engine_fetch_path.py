"""Engine.fetch's two object-read paths: objects only (the reader's result as it is) and objects
joined with a LogCache tail (merge_fetch)."""

from __future__ import annotations

import pytest

import s3stream.engine.core as core
from s3stream.engine.fetchmerge import merge_fetch
from s3stream.model import RecordBatch
from tests.unit.test_engine import Node


async def test_a_fetch_from_objects_only_skips_merge_fetch_and_a_straddling_one_uses_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = await Node().open()
    stream = await client.streams.create_and_open_stream()
    for i in range(6):
        await stream.append(RecordBatch(bytes([i]) * 100, count=2))
    await client.engine.force_upload(None)
    client.engine.cache.try_real_free(target_bytes=0)  # uploaded and freed: only objects hold them
    merges: list[int] = []

    def counting_merge(*args, **kwargs):  # type: ignore[no-untyped-def]
        merges.append(kwargs["start_offset"])
        return merge_fetch(*args, **kwargs)

    monkeypatch.setattr(core, "merge_fetch", counting_merge)
    reads = client.engine.stats.object_reads
    got = await stream.fetch(3, 12, max_bytes=250)
    assert [(b.base_offset, b.count) for b in got] == [(2, 2), (4, 2), (6, 2)]
    assert client.engine.stats.object_reads == reads + 1
    assert merges == []
    # a tail in the LogCache: the head from objects is joined to it and checked
    await stream.append(RecordBatch(b"t" * 100, count=2))
    got = await stream.fetch(9, 14)
    assert [(b.base_offset, b.count) for b in got] == [(8, 2), (10, 2), (12, 2)]
    assert merges == [9]
    await client.close()
