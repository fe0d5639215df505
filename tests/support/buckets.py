"""A MultiBucketStorage over in-memory buckets with per-bucket fault plans, for unit tests."""

from __future__ import annotations

from dataclasses import dataclass

from s3stream.buckets.health import BucketHealth
from s3stream.buckets.storage import MultiBucketStorage
from s3stream.buckets.strategy import make_strategy
from s3stream.ids import ObjectId
from s3stream.metadata.memory import MemoryMetadataStore
from s3stream.objectformat.keys import object_key
from s3stream.storage.base import ObjectStorage
from s3stream.storage.memory import MemoryObjectStorage
from tests.support.faults import Fault, FaultPlan, FaultyObjectStorage

NAMESPACE = "ns"
TTL_MS = 3_600_000


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


@dataclass
class Rig:
    storage: MultiBucketStorage
    metadata: MemoryMetadataStore
    inner: dict[int, MemoryObjectStorage]
    faulty: dict[int, FaultyObjectStorage]
    clock: FakeClock

    def fail(self, bucket_id: int, *ops: str, times: int | None = None) -> None:
        """Make ``ops`` (or every op) of a bucket fail as UnavailableError from now on."""
        plan = self.faulty[bucket_id].plan
        plan.faults = [Fault(op, times=times) for op in (ops or ("*",))]
        plan.enabled = True

    def heal(self, bucket_id: int) -> None:
        self.faulty[bucket_id].plan.enabled = False

    async def new_key(self) -> tuple[ObjectId, str]:
        object_id = await self.metadata.prepare_objects(count=1, ttl_ms=TTL_MS)
        return object_id, object_key(object_id, NAMESPACE)

    async def write(self, data: bytes = b"payload") -> tuple[ObjectId, str]:
        object_id, key = await self.new_key()
        upload = self.storage.upload(key)
        await upload.write(data)
        await upload.complete()
        return object_id, key

    def holders(self, key: str) -> list[int]:
        return [b for b, store in self.inner.items() if key in store._objects]


def make_rig(
    strategy: str,
    ids: tuple[int, ...] = (0, 1),
    *,
    weights: dict[int, int] | None = None,
    errors_max: int = 3,
) -> Rig:
    inner = {b: MemoryObjectStorage(f"bucket{b}") for b in ids}
    faulty = {b: FaultyObjectStorage(store, FaultPlan([], enabled=False)) for b, store in inner.items()}
    clock = FakeClock()
    health = BucketHealth(ids, errors_max=errors_max, window_ms=10_000, probe_successes=3, clock_s=clock)
    metadata = MemoryMetadataStore()
    buckets: dict[int, ObjectStorage] = dict(faulty)
    storage = MultiBucketStorage(
        buckets, strategy=make_strategy(strategy, ids, weights), health=health, metadata=metadata
    )
    return Rig(storage, metadata, inner, faulty, clock)
