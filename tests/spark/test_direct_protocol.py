"""The direct path's protocol, pure (no Spark, no engine): offset plan, slots, tiling, committed records."""

from __future__ import annotations

import pytest

from s3stream.errors import ConflictError, CorruptionError, InvalidArgumentError
from spark_sink.direct_protocol import (
    SLOTS_PER_TASK,
    DirectProgress,
    ObjectDescription,
    SlotTable,
    TaskCount,
    WrittenRange,
    attempt_slots,
    check_tiling,
    committed_after_direct,
    direct_committed_key,
    direct_progress_key,
    load_committed,
    plan_bases,
)
from spark_sink.protocol import Committed, DiscardedRange, committed_key


def _counts() -> list[TaskCount]:
    # tasks 0..2 over partitions 0..1; task 1 holds only partition 1; rows listed out of order
    return [
        TaskCount(2, 0, 4, 40),
        TaskCount(0, 1, 3, 30),
        TaskCount(0, 0, 5, 50),
        TaskCount(1, 1, 7, 70),
        TaskCount(2, 1, 0, 0),  # an empty row counts for nothing
    ]


def test_bases_continue_each_partition_in_task_order() -> None:
    plan = plan_bases(_counts(), [100, 200])
    assert plan.bases == {(0, 0): 100, (0, 1): 200, (1, 1): 203, (2, 0): 105}
    assert plan.ends == (109, 210)
    assert plan.tasks == (0, 1, 2)
    assert plan.task_partitions(0) == (0, 1)
    assert plan.task_partitions(2) == (0,)
    assert plan.record_count == 19


def test_plan_is_independent_of_the_order_of_the_count_rows() -> None:
    assert plan_bases(list(reversed(_counts())), [0, 0]) == plan_bases(_counts(), [0, 0])


def test_count_rows_of_one_task_and_partition_add_up() -> None:
    plan = plan_bases([TaskCount(0, 0, 2, 1), TaskCount(0, 0, 3, 1)], [7])
    assert plan.counts == {(0, 0): 5}
    assert plan.ends == (12,)


@pytest.mark.parametrize("row", [TaskCount(0, 2, 1, 1), TaskCount(0, -1, 1, 1), TaskCount(0, 0, -1, 0)])
def test_bad_count_rows_are_refused(row: TaskCount) -> None:
    with pytest.raises(InvalidArgumentError):
        plan_bases([row], [0, 0])


def test_slot_ids_never_collide_across_tasks_and_attempts() -> None:
    table = SlotTable(1000, (0, 3, 7))
    ids = [table.object_id(t, s) for t in (0, 3, 7) for s in range(SLOTS_PER_TASK)]
    assert len(set(ids)) == len(ids) == table.id_count
    assert sorted(ids) == list(table.all_ids())
    assert table.object_id(3, 0) == 1000 + SLOTS_PER_TASK


def test_an_attempt_tries_the_slots_from_its_attempt_number() -> None:
    assert list(attempt_slots(0, 4)) == [0, 1, 2, 3]
    assert list(attempt_slots(2, 4)) == [2, 3]
    assert list(attempt_slots(9, 4)) == []


def _described(
    plan_counts: list[TaskCount], ends: list[int]
) -> tuple[object, SlotTable, list[ObjectDescription]]:
    plan = plan_bases(plan_counts, ends)
    slots = SlotTable(50, plan.tasks)
    out = []
    for t in plan.tasks:
        parts = plan.task_partitions(t)
        ranges = tuple(
            WrittenRange(p, plan.bases[(t, p)], plan.bases[(t, p)] + plan.counts[(t, p)], 9) for p in parts
        )
        out.append(ObjectDescription(t, 1, slots.object_id(t, 1), 999, len(parts) == 1, ranges))
    return plan, slots, out


def test_tiling_accepts_exactly_the_plan_in_task_order() -> None:
    plan, slots, objects = _described(_counts(), [0, 0])
    winners = check_tiling(plan, slots, list(reversed(objects)))  # type: ignore[arg-type]
    assert [w.task for w in winners] == [0, 1, 2]
    assert [w.stream_object for w in winners] == [False, True, True]


def test_tiling_refuses_a_missing_extra_or_shifted_object() -> None:
    plan, slots, objects = _described(_counts(), [0, 0])
    with pytest.raises(ConflictError, match="planned"):
        check_tiling(plan, slots, objects[:-1])  # type: ignore[arg-type]
    with pytest.raises(ConflictError, match="two objects"):
        check_tiling(plan, slots, [*objects, objects[0]])  # type: ignore[arg-type]
    o = objects[1]
    shifted = ObjectDescription(
        o.task, o.slot, o.object_id, o.size_bytes, o.stream_object, (WrittenRange(1, 4, 11, 9),)
    )
    with pytest.raises(ConflictError, match="changed between the count pass and the write pass"):
        check_tiling(plan, slots, [objects[0], shifted, objects[2]])  # type: ignore[arg-type]
    wrong_id = ObjectDescription(o.task, o.slot, o.object_id + 1, o.size_bytes, o.stream_object, o.ranges)
    with pytest.raises(ConflictError, match="object id"):
        check_tiling(plan, slots, [objects[0], wrong_id, objects[2]])  # type: ignore[arg-type]


def test_progress_record_round_trips_and_rejects_garbage() -> None:
    key = direct_progress_key("q", "t")
    assert DirectProgress.decode(DirectProgress(7).encode(), key=key) == DirectProgress(7)
    for raw in (b"{", b'{"version": 2, "batch_id": 1}', b'{"version": 3, "batch_id": -1}', b'{"version": 3}'):
        with pytest.raises(CorruptionError):
            DirectProgress.decode(raw, key=key)


def test_direct_keys_are_in_their_own_namespace() -> None:
    assert direct_committed_key("t") != committed_key("t")
    assert not direct_progress_key("q", "t").startswith("spark_sink/")


def test_the_newer_committed_record_wins_whichever_path_wrote_it() -> None:
    kv: dict[str, bytes] = {}
    assert load_committed(kv.get, "t", 2) == Committed.empty(2)
    kv[committed_key("t")] = Committed((5, 5), "q", 0).encode()
    assert load_committed(kv.get, "t", 2).ends == (5, 5)
    kv[direct_committed_key("t")] = Committed((9, 5), "q", 1).encode()
    assert load_committed(kv.get, "t", 2).batch_id == 1
    # an abandon (driver path) after the direct batch: larger ends, discarded ranges kept
    kv[committed_key("t")] = Committed((9, 8), "q", 1, (DiscardedRange(1, 5, 8),)).encode()
    assert load_committed(kv.get, "t", 2).ends == (9, 8)
    # equal ends: the one with more discarded ranges is the later one
    kv[direct_committed_key("t")] = Committed((9, 8), "q", 2).encode()
    assert load_committed(kv.get, "t", 2).discarded == (DiscardedRange(1, 5, 8),)


def test_committed_after_a_direct_batch_keeps_the_discarded_ranges() -> None:
    before = Committed((3, 8), "q", 1, (DiscardedRange(1, 5, 8),))
    plan = plan_bases([TaskCount(0, 0, 2, 1)], before.ends)
    after = committed_after_direct(before, plan, query_id="q2", batch_id=0)
    assert after == Committed((5, 8), "q2", 0, before.discarded)
