"""Which buckets hold an object: the ``object_buckets`` rows of schema version 6, decided here.

With several buckets (:mod:`s3stream.buckets`) every object's metadata names the bucket(s) that hold
it. An object without a row lives in the data dir's first bucket, so a single-bucket data dir (and one
created before version 6) needs no rows at all. Pure: a controller function on a
:class:`~s3stream.metadata.controller.Txn`, like the other ``*_ops`` modules.

Invariants: a row names an object that exists (in any state) when it is written; rows are only
added (recording a bucket twice is a no-op); all of an object's rows leave with its record
(:func:`s3stream.metadata.object_ops.remove_objects` writes :class:`RemovePlacements`).
"""

from __future__ import annotations

from collections.abc import Sequence

from s3stream.errors import ErrorCode, InvalidArgumentError, NotFoundError
from s3stream.ids import ObjectId
from s3stream.metadata.changes import PutPlacement
from s3stream.metadata.controller import GET_LIMIT_MAX, Txn, check_int

BUCKET_ID_MAX = (1 << 31) - 1
BUCKETS_PER_OBJECT_MAX = 64
"""Buckets one object may be recorded in (replication writes every bucket of the list)."""


def check_bucket_ids(bucket_ids: Sequence[int]) -> tuple[int, ...]:
    """``bucket_ids`` as a tuple: 1..BUCKETS_PER_OBJECT_MAX ints in ``[0, BUCKET_ID_MAX]``, no repeats."""
    ids = tuple(bucket_ids)
    if not 1 <= len(ids) <= BUCKETS_PER_OBJECT_MAX:
        raise InvalidArgumentError(f"bucket_ids: give 1..{BUCKETS_PER_OBJECT_MAX} bucket ids, got {len(ids)}")
    for bucket_id in ids:
        check_int("bucket id", bucket_id, low=0, high=BUCKET_ID_MAX)
    if len(set(ids)) != len(ids):
        raise InvalidArgumentError(f"bucket_ids repeat an id: {list(ids)}")
    return ids


def check_object_ids(object_ids: Sequence[ObjectId]) -> tuple[ObjectId, ...]:
    ids = tuple(object_ids)
    if len(ids) > GET_LIMIT_MAX:
        raise InvalidArgumentError(f"at most {GET_LIMIT_MAX} object ids per call, got {len(ids)}")
    for object_id in ids:
        check_int("object id", object_id, low=0)
    return ids


def record_placement(txn: Txn, *, object_id: ObjectId, bucket_ids: tuple[int, ...]) -> None:
    """Add a row per bucket not yet recorded; the object must exist (NotFoundError otherwise)."""
    check_int("object_id", object_id, low=0)
    if txn.view.object(object_id) is None:
        raise NotFoundError(f"object {object_id} does not exist", code=ErrorCode.OBJECT_NOT_EXIST)
    known = set(txn.view.placements((object_id,)).get(object_id, ()))
    for bucket_id in bucket_ids:
        if bucket_id not in known:
            txn.write(PutPlacement(object_id, bucket_id))
