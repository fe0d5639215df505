"""Where a new object goes: the four placement strategies over an ordered list of bucket ids.

A strategy is a pure decision: given the buckets in list order and which of them are healthy, it
returns the bucket(s) a new object is written to. It never does I/O and never fails: when no bucket
is healthy it still answers (the unhealthy ones, in its own order), so writes keep being attempted and
the health tracker learns when a bucket is back.

* ``round_robin``: rotate over the healthy buckets, one bucket per object.
* ``failover``: the first healthy bucket in list order (the primary while it is healthy).
* ``replication``: every bucket, healthy or not (an object is committed only once all hold it).
* ``sharding``: one bucket per object, drawn by weight among the healthy buckets of weight > 0
  (smooth weighted round robin: over any run of objects each bucket's share follows its weight; a
  weight of 0 takes no new objects and still serves reads, unless every weighted bucket is unhealthy:
  then the healthy ones of weight 0 take them in turn). Weights change while running.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Sequence
from typing import Protocol

from s3stream.errors import InvalidArgumentError

STRATEGIES = ("round_robin", "failover", "replication", "sharding")


class PlacementStrategy(Protocol):
    name: str

    def choose(self, bucket_ids: Sequence[int], healthy: Callable[[int], bool]) -> tuple[int, ...]:
        """The bucket(s) of a new object; ``bucket_ids`` is the list order (never empty)."""
        ...

    def next_after(
        self, bucket_ids: Sequence[int], healthy: Callable[[int], bool], tried: Sequence[int]
    ) -> int | None:
        """The bucket a single-bucket upload moves to once ``tried`` failed; None: no other bucket."""
        ...


def _fallback(bucket_ids: Sequence[int], healthy: Callable[[int], bool], tried: Sequence[int]) -> int | None:
    """The first healthy untried bucket in list order, else the first untried one."""
    untried = [b for b in bucket_ids if b not in tried]
    for bucket_id in untried:
        if healthy(bucket_id):
            return bucket_id
    return untried[0] if untried else None


class RoundRobin:
    name = "round_robin"

    def __init__(self, start: int | None = None) -> None:
        # each process starts at a random bucket: nodes started together do not all load bucket 0 first
        self._next = random.randrange(1 << 16) if start is None else start

    def choose(self, bucket_ids: Sequence[int], healthy: Callable[[int], bool]) -> tuple[int, ...]:
        candidates = [b for b in bucket_ids if healthy(b)] or list(bucket_ids)
        chosen = candidates[self._next % len(candidates)]
        self._next = (self._next + 1) % (1 << 30)
        return (chosen,)

    def next_after(
        self, bucket_ids: Sequence[int], healthy: Callable[[int], bool], tried: Sequence[int]
    ) -> int | None:
        return _fallback(bucket_ids, healthy, tried)


class Failover:
    name = "failover"

    def choose(self, bucket_ids: Sequence[int], healthy: Callable[[int], bool]) -> tuple[int, ...]:
        for bucket_id in bucket_ids:
            if healthy(bucket_id):
                return (bucket_id,)
        return (bucket_ids[0],)

    def next_after(
        self, bucket_ids: Sequence[int], healthy: Callable[[int], bool], tried: Sequence[int]
    ) -> int | None:
        return _fallback(bucket_ids, healthy, tried)


class Replication:
    name = "replication"

    def choose(self, bucket_ids: Sequence[int], healthy: Callable[[int], bool]) -> tuple[int, ...]:
        return tuple(bucket_ids)

    def next_after(
        self, bucket_ids: Sequence[int], healthy: Callable[[int], bool], tried: Sequence[int]
    ) -> int | None:
        return None  # every bucket must hold the object: there is nowhere else to go


class Sharding:
    """Smooth weighted round robin (each pick: every candidate gains its weight, the largest wins and
    loses the total), so placement follows the weights closely over short runs too."""

    name = "sharding"

    def __init__(self, weights: dict[int, int]) -> None:
        self._lock = threading.Lock()
        self._weights: dict[int, int] = {}
        self._current: dict[int, int] = {}
        self.set_weights(weights)

    @property
    def weights(self) -> dict[int, int]:
        return dict(self._weights)

    def set_weights(self, weights: dict[int, int]) -> None:
        if not weights or any(w < 0 for w in weights.values()) or not any(weights.values()):
            raise InvalidArgumentError(f"sharding weights must be >= 0 and not all 0, got {weights!r}")
        with self._lock:
            self._weights = dict(weights)
            self._current = {b: 0 for b in weights}

    def choose(self, bucket_ids: Sequence[int], healthy: Callable[[int], bool]) -> tuple[int, ...]:
        weighted = [b for b in bucket_ids if self._weights.get(b, 0) > 0]
        # every weighted bucket down: a healthy bucket of weight 0 rather than a dead one
        candidates = (
            [b for b in weighted if healthy(b)]
            or [b for b in bucket_ids if healthy(b)]
            or weighted
            or list(bucket_ids)
        )
        by_weight = all(self._weights.get(b, 0) > 0 for b in candidates)
        with self._lock:
            total = 0
            for bucket_id in candidates:
                weight = self._weights.get(bucket_id, 0) if by_weight else 1
                self._current[bucket_id] = self._current.get(bucket_id, 0) + weight
                total += weight
            chosen = max(candidates, key=lambda b: (self._current[b], -bucket_ids.index(b)))
            self._current[chosen] -= total
        return (chosen,)

    def next_after(
        self, bucket_ids: Sequence[int], healthy: Callable[[int], bool], tried: Sequence[int]
    ) -> int | None:
        weighted = [b for b in bucket_ids if self._weights.get(b, 0) > 0]
        for pool in (weighted, bucket_ids):  # a healthy bucket first, weighted or not
            for bucket_id in pool:
                if bucket_id not in tried and healthy(bucket_id):
                    return bucket_id
        found = _fallback(weighted, healthy, tried)
        return found if found is not None else _fallback(bucket_ids, healthy, tried)


def make_strategy(name: str, bucket_ids: Sequence[int], weights: dict[int, int] | None) -> PlacementStrategy:
    """The strategy ``name`` (``s3.data.buckets.strategy``); sharding needs ``weights`` (default 1 each)."""
    if name == "round_robin":
        return RoundRobin()
    if name == "failover":
        return Failover()
    if name == "replication":
        return Replication()
    if name == "sharding":
        return Sharding(weights if weights is not None else {b: 1 for b in bucket_ids})
    raise InvalidArgumentError(
        f"s3.data.buckets.strategy must be one of {', '.join(STRATEGIES)}, got {name!r}"
    )
