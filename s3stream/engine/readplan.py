"""Which blocks one GET and one readahead load take: pure planning over the blocks of a read window.

A GET takes a run of consecutive blocks of one object (:func:`merged_runs`, at most
:data:`MERGED_GET_MAX_BYTES`); a readahead load takes whole blocks of one object up to its size, and
the rest of that object when it is small (:func:`plan_load`). No I/O: the reader
(:mod:`s3stream.engine.reader`) carries the plans out.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from s3stream.engine.readstate import BlockRef

MiB = 1 << 20

LOAD_TAIL_DIVISOR = 4
"""A readahead load that would leave at most a quarter of its size of its object takes that rest
along (see :func:`plan_load`)."""
MERGED_GET_MAX_BYTES = 8 * MiB + 8 * MiB // LOAD_TAIL_DIVISOR
"""Largest span of consecutive blocks fetched by one GET: a default readahead load (8 MiB) plus the
rest of its object it may take along (AutoMQ's MAX_MERGE_READ_SIZE is 4 MiB; a GET costs the client
about as much CPU as 1 MiB of data, so fewer, larger GETs pay)."""


def plan_load(size_bytes: int, candidates: Sequence[BlockRef], *, room_bytes: int) -> list[BlockRef]:
    """The blocks of one readahead load: from the first of ``candidates`` (window blocks in offset
    order), whole blocks of that block's object only, within ``size_bytes`` (at least one); and if
    the rest of that object's blocks add up to at most ``size_bytes // LOAD_TAIL_DIVISOR`` (and fit
    in ``room_bytes`` with the load), those too.

    Loads that end where objects end stay aligned with them: a load that ran on into the next
    object took a second GET there, and the loads after it started mid-object, so objects of
    16 MiB and a bit, read with 8 MiB loads, took three data GETs each, two of them split; now two
    (8 MiB, then the rest of the object)."""
    if not candidates:
        return []
    object_id = candidates[0].object_id
    same = list(itertools.takewhile(lambda r: r.object_id == object_id, candidates))
    plan = first_within(size_bytes, same)
    rest_bytes = sum(r.entry.size_bytes for r in same[len(plan) :])
    planned_bytes = sum(r.entry.size_bytes for r in plan)
    if 0 < rest_bytes <= size_bytes // LOAD_TAIL_DIVISOR and planned_bytes + rest_bytes <= room_bytes:
        return same
    return plan


def first_within(size_bytes: int, refs: list[BlockRef]) -> list[BlockRef]:
    """The first of ``refs`` whose blocks add up to at most ``size_bytes`` (at least one), so that a
    load of the merged-GET size is one GET, not one and a sliver."""
    total = 0
    for i, ref in enumerate(refs):
        total += ref.entry.size_bytes
        if total > size_bytes and i:
            return refs[:i]
    return refs


def merged_runs(refs: Sequence[BlockRef]) -> list[list[int]]:
    """Indexes of ``refs`` grouped into merged GETs: runs of consecutive blocks of one object, each
    spanning at most MERGED_GET_MAX_BYTES (a block larger than that is a run of its own)."""
    runs: list[list[int]] = []
    for i, ref in enumerate(refs):
        if runs:
            last = refs[runs[-1][-1]]
            first = refs[runs[-1][0]]
            if (
                last.object_id == ref.object_id
                and last.entry.end_position == ref.entry.start_position
                and ref.entry.end_position - first.entry.start_position <= MERGED_GET_MAX_BYTES
            ):
                runs[-1].append(i)
                continue
        runs.append([i])
    return runs
