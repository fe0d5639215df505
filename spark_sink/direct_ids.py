"""The object ids of a direct micro-batch: how many a commit may release, and how long they live.

A direct micro-batch prepares ``SLOTS_PER_TASK`` ids per task (:class:`~spark_sink.direct_protocol.SlotTable`,
in calls of at most ``PREPARE_IDS_PER_CALL_MAX`` ids) and commits one per task. The metadata store
bounds one commit to ``RANGES_PER_COMMIT_MAX`` ranges plus released ids, so:

- :func:`check_commit_size`: a plan whose (task, partition) ranges alone exceed that bound can never
  commit; it is refused before anything is prepared or uploaded (a replay would fail the same way).
- :func:`split_release`: the commit releases at most :data:`RELEASE_IDS_PER_CALL_MAX` of the unused
  ids (and only what fits beside its ranges); the rest are released after it, in calls of at most
  that many. Ids a crashed driver never released expire after their TTL like any other.
- :class:`PreparedDeadline`: the ids expire ``s3.direct.prepared.ttl.ms`` after they were prepared
  (and GC may then delete the objects under them). A commit after that is refused on the driver
  with an error naming the key, before the metadata store is asked.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from s3stream.errors import InvalidArgumentError
from s3stream.ids import ObjectId
from s3stream.metadata.controller import RANGES_PER_COMMIT_MAX
from spark_sink.direct_protocol import OffsetPlan

TTL_KEY = "s3.direct.prepared.ttl.ms"
"""The configuration key of the prepared ids' TTL (``Config.direct_prepared_ttl_ms``)."""
RELEASE_IDS_PER_CALL_MAX = 10_000
"""Ids one metadata call (the commit, or a release after it) marks destroyed."""
assert RELEASE_IDS_PER_CALL_MAX <= RANGES_PER_COMMIT_MAX


def check_commit_size(plan: OffsetPlan, *, batch_id: int) -> None:
    """Refuse a plan with more (task, partition) ranges than one commit holds (InvalidArgumentError)."""
    ranges = len(plan.counts)
    if ranges > RANGES_PER_COMMIT_MAX:
        raise InvalidArgumentError(
            f"micro-batch {batch_id}: {len(plan.tasks)} Spark partitions write {ranges} (task, topic "
            f"partition) ranges, one metadata commit holds at most {RANGES_PER_COMMIT_MAX}: write it with "
            "fewer Spark partitions (coalesce) or rows grouped by topic partition; nothing was written"
        )


def split_release(
    unused: Sequence[ObjectId], *, range_count: int
) -> tuple[list[ObjectId], list[list[ObjectId]]]:
    """The unused ids the commit releases, and the later calls' (each at most
    :data:`RELEASE_IDS_PER_CALL_MAX`); the commit's share also leaves room for its ``range_count``."""
    assert 0 <= range_count <= RANGES_PER_COMMIT_MAX
    budget = min(RELEASE_IDS_PER_CALL_MAX, RANGES_PER_COMMIT_MAX - range_count)
    now, rest = list(unused[:budget]), unused[budget:]
    later = [
        list(rest[i : i + RELEASE_IDS_PER_CALL_MAX]) for i in range(0, len(rest), RELEASE_IDS_PER_CALL_MAX)
    ]
    return now, later


@dataclass(frozen=True, slots=True)
class PreparedDeadline:
    """When a micro-batch's prepared ids expire, measured on the driver's monotonic clock from just
    before the first ``prepare_objects`` call (so never later than the metadata store's deadline)."""

    ttl_ms: int
    prepared_at_s: float = field(default_factory=time.monotonic)

    def elapsed_ms(self) -> float:
        return (time.monotonic() - self.prepared_at_s) * 1000

    def check(self, *, batch_id: int) -> None:
        """Raise InvalidArgumentError naming :data:`TTL_KEY` if the ids have expired."""
        elapsed = self.elapsed_ms()
        if elapsed >= self.ttl_ms:
            raise expired_error(batch_id, self.ttl_ms, f"the write pass took {elapsed / 1000:.1f} s")


def expired_error(batch_id: int, ttl_ms: int, what: str) -> InvalidArgumentError:
    """The error of a micro-batch whose prepared ids expired before its commit."""
    return InvalidArgumentError(
        f"micro-batch {batch_id}: {what}, its prepared object ids expired after {TTL_KEY} = {ttl_ms} ms; "
        f"nothing was committed and a replay takes as long: raise {TTL_KEY} (or S3STREAM_"
        f"{TTL_KEY.upper().replace('.', '_')}) above the write pass's duration"
    )
