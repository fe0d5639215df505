"""The raw PUT ceiling the ingest workload holds the engine's uploads against."""

from __future__ import annotations

import pytest

from benchmarks.baselines import PutCeilingSpec, raw_put_ceiling
from benchmarks.measure import MIB
from s3stream.storage.memory import MemoryObjectStorage
from tests.support.s3 import S3TestServer


class RecordingStorage(MemoryObjectStorage):
    """Remembers every key put (warm-up included) and the most objects stored at once."""

    def __init__(self) -> None:
        super().__init__()
        self.put_keys: list[str] = []
        self.stored_max = 0

    async def put(self, key: str, data: bytes | bytearray | memoryview, *, if_absent: bool = False) -> None:
        await super().put(key, data, if_absent=if_absent)
        self.put_keys.append(key)
        self.stored_max = max(self.stored_max, self.object_count())


async def test_single_puts_are_warmed_up_then_measured_in_rounds_and_deleted() -> None:
    storage = RecordingStorage()
    spec = PutCeilingSpec(
        total_bytes=6 * MIB,
        put_bytes=2 * MIB,
        object_bytes=10 * MIB,
        part_bytes=5 * MIB,
        concurrency=2,
        rounds=3,
    )
    best = await raw_put_ceiling(storage, None, prefix="unused/", spec=spec)
    warm = [key for key in storage.put_keys if "-warm-" in key]
    measured = [key for key in storage.put_keys if "-warm-" not in key]
    assert len(warm) == 2  # one per slot, before anything is timed
    assert storage.put_keys[:2] == warm
    assert len(measured) == 3 * 3  # three rounds of 6 MiB in 2 MiB PUTs
    assert storage.object_count() == 0  # each round deletes its objects
    assert storage.stored_max <= 3
    assert best.payload_bytes == 6 * MIB
    assert best.op_count == 3
    assert best.latency.count == 3
    assert best.name == "raw PutObject 2 MiB, 2 in flight"
    (note,) = best.notes
    rates = [float(rate) for rate in note.split(": ")[1].removesuffix(" MB/s").split(", ")]
    assert len(rates) == 3
    assert best.mb_per_s == pytest.approx(max(rates), abs=0.5)


def test_the_spec_rejects_parts_below_the_s3_minimum_or_above_the_object() -> None:
    with pytest.raises(ValueError, match="part_bytes"):
        PutCeilingSpec(total_bytes=MIB, part_bytes=4 * MIB)
    with pytest.raises(ValueError, match="part_bytes"):
        PutCeilingSpec(total_bytes=MIB, object_bytes=8 * MIB, part_bytes=16 * MIB)
    assert PutCeilingSpec(total_bytes=MIB).label(multipart=True) == (
        "best of PutObject 16 MiB, 4 in flight / multipart 32 MiB objects in 16 MiB parts, 4 objects in flight"
    )


@pytest.mark.integration
async def test_on_s3_both_shapes_are_measured_and_nothing_is_left(
    s3_server: S3TestServer, s3_prefix: str
) -> None:
    from benchmarks.baselines import raw_s3_client
    from s3stream.storage.s3 import S3Config, S3ObjectStorage

    target = s3_server.bench_target()
    storage = S3ObjectStorage(
        S3Config(
            bucket=target.bucket,
            endpoint=target.endpoint,
            region=target.region,
            path_style=True,
            access_key=target.access_key,
            secret_key=target.secret_key,
            prefix=s3_prefix + "single/",
        )
    )
    spec = PutCeilingSpec(
        total_bytes=10 * MIB, put_bytes=5 * MIB, object_bytes=10 * MIB, part_bytes=5 * MIB, concurrency=2
    )
    try:
        best = await raw_put_ceiling(storage, target, prefix=s3_prefix + "multipart/", spec=spec)
    finally:
        await storage.close()
    single, multipart = best.notes
    assert single.startswith("PutObject 5 MiB, 2 in flight: ")
    assert multipart.startswith("multipart 10 MiB objects in 5 MiB parts, 2 objects in flight: ")
    assert best.payload_bytes == 10 * MIB
    assert best.mb_per_s > 0
    async with raw_s3_client(target) as client:
        listed = await client.list_objects_v2(Bucket=target.bucket, Prefix=s3_prefix)
        uploads = await client.list_multipart_uploads(Bucket=target.bucket, Prefix=s3_prefix)
    assert listed.get("Contents", []) == []
    assert uploads.get("Uploads", []) == []
