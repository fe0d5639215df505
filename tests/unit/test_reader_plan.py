"""How a readahead load picks its blocks: whole blocks of one object within its size, and the short
rest of that object along, so that loads stay aligned with objects (one GET each)."""

from __future__ import annotations

from s3stream.engine.readplan import LOAD_TAIL_DIVISOR, MERGED_GET_MAX_BYTES, merged_runs, plan_load
from s3stream.engine.readstate import BlockRef
from s3stream.ids import ObjectId
from s3stream.objectformat import IndexEntry

SIZE = 100


def _object(object_id: int, first_offset: int, count: int) -> list[BlockRef]:
    return [
        BlockRef(
            ObjectId(object_id),
            f"k{object_id}",
            1 << 30,
            IndexEntry(1, first_offset + i, first_offset + i + 1, 1, i * SIZE, SIZE),
        )
        for i in range(count)
    ]


def test_a_load_stops_where_its_object_ends() -> None:
    first, second = _object(1, 0, 3), _object(2, 3, 10)
    assert plan_load(10 * SIZE, first + second, room_bytes=1 << 30) == first  # not into the next object


def test_a_load_takes_a_short_rest_of_its_object_along() -> None:
    blocks = _object(1, 0, 10) + _object(2, 10, 10)
    # 8 blocks fit; the 2 left of the object are at most a quarter of the load: one GET for all 10
    assert plan_load(8 * SIZE, blocks, room_bytes=1 << 30) == blocks[:10]
    # 7 fit; the 3 left are more than a quarter: they start the next load
    assert plan_load(7 * SIZE, blocks, room_bytes=1 << 30) == blocks[:7]
    # no room in the cache for the rest: the load keeps to its size
    assert plan_load(8 * SIZE, blocks, room_bytes=9 * SIZE) == blocks[:8]
    assert plan_load(8 * SIZE, [], room_bytes=1 << 30) == []


def test_a_load_and_the_rest_it_takes_along_are_one_get() -> None:
    load_bytes = MERGED_GET_MAX_BYTES * LOAD_TAIL_DIVISOR // (LOAD_TAIL_DIVISOR + 1)
    blocks = [
        BlockRef(ObjectId(1), "k1", 1 << 30, IndexEntry(1, i, i + 1, 1, i * (1 << 20), 1 << 20))
        for i in range(load_bytes * 5 // 4 >> 20)
    ]
    plan = plan_load(load_bytes, blocks, room_bytes=1 << 40)
    assert plan == blocks
    assert merged_runs(plan) == [list(range(len(plan)))]
