"""Joining the two halves of a fetch: the object-storage head and the LogCache tail.

:func:`merge_fetch` checks what the read path returned against the offsets asked for: the result
starts with the batch holding the start offset and continues without gap or overlap, anything else
is a :class:`~s3stream.errors.CorruptionError`. Pure: batches in, a list out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

from s3stream.errors import CorruptionError, InvalidArgumentError

_UNBOUNDED = (1 << 63) - 1


class Batch(Protocol):
    @property
    def base_offset(self) -> int: ...

    @property
    def end_offset(self) -> int: ...

    @property
    def payload(self) -> bytes: ...


B = TypeVar("B", bound=Batch)


def merge_fetch(
    cached: Sequence[B],
    from_objects: Sequence[B],
    *,
    start_offset: int,
    end_offset: int,
    max_bytes: int,
    source: str = "fetch",
) -> list[B]:
    """One contiguous, ordered fetch result from the object-storage head and the LogCache tail.

    ``cached`` is what the LogCache holds for the range (possibly empty, possibly starting after
    ``start_offset``); ``from_objects`` is what :meth:`~s3stream.engine.reader.ObjectStreamReader.read` returned for
    ``[start_offset, cached[0].base_offset)`` (or the whole range) with the same ``max_bytes``.
    If the cache holds ``start_offset`` the objects are not needed and ignored.

    The result starts with the batch containing ``start_offset``, has no gap or overlap, stops
    before ``end_offset`` and once ``max_bytes`` payload bytes are reached (at least one batch).
    A gap between the two parts, or inside either, raises :class:`CorruptionError`.
    """
    if start_offset < 0 or end_offset < start_offset or max_bytes <= 0:
        raise InvalidArgumentError(f"bad fetch range [{start_offset}, {end_offset}) or max_bytes {max_bytes}")
    out: list[B] = []
    if start_offset == end_offset:
        return out
    budget = max_bytes
    next_offset = start_offset

    def take(batch: B) -> bool:
        """Append ``batch``; False once the range or the byte budget is used up."""
        nonlocal budget, next_offset
        if batch.base_offset >= end_offset or (out and budget <= 0):
            return False
        if out:
            if batch.base_offset != next_offset:
                kind = "gap" if batch.base_offset > next_offset else "overlap"
                raise CorruptionError(
                    f"{kind} in fetch result: batch at offset {batch.base_offset} follows one ending at "
                    f"{next_offset}",
                    source=source,
                )
        elif not batch.base_offset <= start_offset < batch.end_offset:
            raise CorruptionError(
                f"fetch from offset {start_offset} begins with the batch [{batch.base_offset}, "
                f"{batch.end_offset})",
                source=source,
            )
        out.append(batch)
        next_offset = batch.end_offset
        budget -= len(batch.payload)
        return True

    cache_start = cached[0].base_offset if cached else _UNBOUNDED
    if cache_start > start_offset:
        for batch in from_objects:
            if not out and batch.end_offset <= start_offset:
                continue
            if batch.base_offset >= cache_start or not take(batch):
                break
        if out and (next_offset >= end_offset or budget <= 0):
            return out
        if cached and next_offset < cache_start:
            raise CorruptionError(
                f"no data for [{next_offset}, {cache_start}) between object storage and the LogCache",
                source=source,
            )
    for batch in cached:
        if not out and batch.end_offset <= start_offset:
            continue
        if not take(batch):
            break
    return out
