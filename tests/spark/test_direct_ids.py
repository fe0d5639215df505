"""The direct path's ids, pure: slots across several prepare calls, releases split to fit a commit,
plans too large for one commit refused, the TTL deadline."""

from __future__ import annotations

import time

import pytest

from s3stream.errors import InvalidArgumentError
from s3stream.ids import ObjectId
from s3stream.metadata.controller import PREPARE_MAX_COUNT, RANGES_PER_COMMIT_MAX
from spark_sink.direct_ids import (
    RELEASE_IDS_PER_CALL_MAX,
    PreparedDeadline,
    check_commit_size,
    split_release,
)
from spark_sink.direct_protocol import (
    SLOTS_PER_TASK,
    SlotTable,
    TaskCount,
    plan_bases,
    prepare_call_sizes,
    tasks_per_prepare_call,
)


def test_prepare_calls_hold_whole_tasks_and_stay_under_the_store_limit() -> None:
    per_call = tasks_per_prepare_call()
    assert per_call * SLOTS_PER_TASK <= PREPARE_MAX_COUNT < (per_call + 1) * SLOTS_PER_TASK
    assert prepare_call_sizes(0) == []
    assert prepare_call_sizes(3) == [3 * SLOTS_PER_TASK]
    assert prepare_call_sizes(per_call) == [per_call * SLOTS_PER_TASK]
    sizes = prepare_call_sizes(2 * per_call + 1)
    assert sizes == [per_call * SLOTS_PER_TASK] * 2 + [SLOTS_PER_TASK]
    assert all(s <= PREPARE_MAX_COUNT for s in sizes)


def test_slots_across_prepare_calls_are_distinct_and_are_exactly_the_prepared_ids() -> None:
    per_call = tasks_per_prepare_call()
    tasks = tuple(range(0, 2 * (2 * per_call + 7), 2))  # sparse task numbers, three calls
    firsts = (5_000_000, 1_000, 90_000)  # calls need not be consecutive nor ascending
    table = SlotTable(firsts[0], tasks, later_first_ids=firsts[1:])
    ids = [table.object_id(t, s) for t in tasks for s in range(SLOTS_PER_TASK)]
    assert len(set(ids)) == len(ids) == table.id_count
    assert sorted(ids) == sorted(table.all_ids())
    sizes = prepare_call_sizes(len(tasks))
    for first, size in zip(firsts, sizes, strict=True):
        assert set(range(first, first + size)) <= set(ids)
    assert table.object_id(tasks[per_call], 0) == firsts[1]  # the first task of the second call
    assert table.object_id(tasks[-1], SLOTS_PER_TASK - 1) == firsts[2] + sizes[2] - 1
    with pytest.raises(InvalidArgumentError, match="3 prepare calls"):
        SlotTable(firsts[0], tasks, later_first_ids=firsts[1:2])
    assert list(SlotTable(7, (1, 2)).all_ids()) == list(range(7, 7 + 2 * SLOTS_PER_TASK))


def test_releases_fit_beside_the_commits_ranges_and_the_rest_go_in_bounded_calls() -> None:
    unused = [ObjectId(i) for i in range(25_001)]
    now, later = split_release(unused, range_count=700)
    assert len(now) == RELEASE_IDS_PER_CALL_MAX
    assert [len(c) for c in later] == [10_000, 5_001]
    assert now + [i for c in later for i in c] == unused
    # a commit with many ranges releases only what fits beside them
    now, later = split_release(unused[:5000], range_count=RANGES_PER_COMMIT_MAX - 10)
    assert (len(now), [len(c) for c in later]) == (10, [4990])
    now, later = split_release(unused[:5], range_count=RANGES_PER_COMMIT_MAX)
    assert (now, later) == ([], [unused[:5]])
    assert split_release([], range_count=3) == ([], [])


def test_a_plan_with_more_ranges_than_one_commit_holds_is_refused_before_anything_is_written() -> None:
    partitions = 100
    fits = [
        TaskCount(t, p, 1, 1) for t in range(RANGES_PER_COMMIT_MAX // partitions) for p in range(partitions)
    ]
    check_commit_size(plan_bases(fits, [0] * partitions), batch_id=3)
    over = [*fits, TaskCount(RANGES_PER_COMMIT_MAX // partitions, 0, 1, 1)]
    with pytest.raises(InvalidArgumentError, match=r"micro-batch 3: .* at most 100000"):
        check_commit_size(plan_bases(over, [0] * partitions), batch_id=3)


def test_the_deadline_names_the_key_once_the_ttl_has_run_out() -> None:
    deadline = PreparedDeadline(50)
    deadline.check(batch_id=1)
    time.sleep(0.06)
    with pytest.raises(
        InvalidArgumentError, match=r"micro-batch 1: the write pass took .* s3\.direct\.prepared"
    ):
        deadline.check(batch_id=1)
