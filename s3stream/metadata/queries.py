"""Read-side queries: AutoMQ's getObjects walk and the stream-object listing.

``docs/automq-model.md`` section 7 (get_objects); StreamSet ranges are kept in metadata, so no object
index reads are needed.
"""

from __future__ import annotations

from collections.abc import Sequence

from s3stream.errors import (
    ErrorCode,
    InvalidArgumentError,
    NotFoundError,
    OffsetOutOfRangeError,
)
from s3stream.ids import ObjectId, StreamId
from s3stream.metadata.base import (
    ObjectKind,
    ObjectSlice,
    RangeMetadata,
    StreamObject,
)
from s3stream.metadata.controller import (
    GET_LIMIT_MAX,
    StateView,
    check_int,
)

SCAN_PAGE_MIN = 16
"""StreamSet ranges fetched per step of the getObjects scan, at least."""


def _check_query(start_offset: int, end_offset: int, limit: int) -> None:
    check_int("start_offset", start_offset, low=0)
    check_int("end_offset", end_offset, low=-1)
    if end_offset != -1 and end_offset <= start_offset:
        raise InvalidArgumentError(f"end_offset {end_offset} must be -1 or above start_offset {start_offset}")
    check_int("limit", limit, low=1, high=GET_LIMIT_MAX)


def get_objects(
    view: StateView, *, stream_id: StreamId, start_offset: int, end_offset: int, limit: int
) -> list[ObjectSlice]:
    """AutoMQ's getObjects: stream objects first, then the StreamSet objects of the node owning the range
    that holds the next offset, in order-id order; slices are contiguous from the one holding ``start_offset``."""
    check_int("stream_id", stream_id, low=0)
    _check_query(start_offset, end_offset, limit)
    stream = view.stream(stream_id)
    if stream is None:
        raise NotFoundError(f"stream {stream_id} does not exist", code=ErrorCode.STREAM_NOT_EXIST)
    if start_offset < stream.start_offset:
        raise OffsetOutOfRangeError(
            f"offset {start_offset} of stream {stream_id} is below {stream.start_offset}"
        )
    out: list[ObjectSlice] = []
    next_offset = start_offset

    def take(object_id: ObjectId, kind: ObjectKind, size_bytes: int, start: int, end: int) -> bool:
        """Append a slice if it continues at ``next_offset``; True when the query is then complete."""
        nonlocal next_offset
        out.append(ObjectSlice(object_id, kind, size_bytes, stream_id, start, end))
        next_offset = end
        return len(out) >= limit or (end_offset != -1 and next_offset >= end_offset)

    def fits(start: int) -> bool:
        return start == next_offset or (not out and start <= next_offset)

    while True:
        round_start = next_offset
        for so in view.stream_objects_from(stream_id, next_offset, limit - len(out)):
            if not fits(so.start_offset):
                break
            if take(so.object_id, ObjectKind.STREAM, so.size_bytes, so.start_offset, so.end_offset):
                return out
        owner = _range_holding(stream.ranges, next_offset)
        after: tuple[int, int] | None = None
        while owner is not None:  # the owner's StreamSet objects in order-id order, a page at a time
            page_size = min(max(limit - len(out) + 1, SCAN_PAGE_MIN), GET_LIMIT_MAX)
            page = view.stream_set_ranges_from(
                owner.node_id, stream_id, next_offset, after=after, limit=page_size
            )
            for item in page:
                r = item.range
                if r.end_offset <= next_offset:
                    continue
                if fits(r.start_offset):
                    size = item.object_size_bytes
                    if take(item.object_id, ObjectKind.STREAM_SET, size, r.start_offset, r.end_offset):
                        return out
                elif r.start_offset > next_offset:
                    owner = None
                    break
            if len(page) < page_size:
                break
            after = (page[-1].order_id, page[-1].object_id)
        if next_offset == round_start:
            return out


def _range_holding(ranges: Sequence[RangeMetadata], offset: int) -> RangeMetadata | None:
    for i, r in enumerate(ranges):
        last = i == len(ranges) - 1
        if r.start_offset <= offset and (offset < r.end_offset or last):
            return r
    return None


def get_stream_objects(
    view: StateView, *, stream_id: StreamId, start_offset: int, end_offset: int, limit: int
) -> list[StreamObject]:
    """Stream objects overlapping ``[start_offset, end_offset)`` by start offset; gaps possible."""
    check_int("stream_id", stream_id, low=0)
    _check_query(start_offset, end_offset, limit)
    out = []
    for so in view.stream_objects_from(stream_id, start_offset, limit):
        if end_offset != -1 and so.start_offset >= end_offset:
            break
        out.append(so)
    return out
