"""The direct path's per-micro-batch work on the driver and per task is linear in the plan, not tasks^2.

A synthetic plan of 5,000 tasks x 20 partitions (100,000 count rows): planning the offsets, the slot
ids, the per-task assignments, every task's look-up of its own assignment and the tiling check of
5,000 descriptions take a few CPU seconds. Code that scans the plan per task (``tasks.index``, a
search of every count per task) does about 1.5e9 steps here (5e8 in the tiling check alone).
"""

from __future__ import annotations

import pickle
import time

from spark_sink.direct_protocol import (
    ObjectDescription,
    SlotTable,
    TaskCount,
    WrittenRange,
    check_tiling,
    plan_bases,
    prepare_call_sizes,
    task_assignments,
    tasks_per_prepare_call,
)
from spark_sink.direct_tasks import DirectOptions
from spark_sink.encode import EncodeOptions

TASKS = 5_000
PARTITIONS = 20
CPU_SECONDS_MAX = 6.0
"""This process's CPU time (other processes' load does not count): about 1.2 s here under a load of 20; the
code before the index spent 18 CPU s in its tiling check alone, and scanned the plan again in every task."""


def test_a_large_plan_is_handled_in_time_linear_in_its_size() -> None:
    counts = [
        TaskCount(t, p, 1 + (t + p) % 3, 0, t * PARTITIONS + p)
        for t in range(TASKS)
        for p in range(PARTITIONS)
    ]
    counts.reverse()  # any order
    descriptions_input = []
    started = time.process_time()
    plan = plan_bases(counts, [100] * PARTITIONS)
    # the ids of several prepare calls, here back to back so task i's slot 0 is 1_000 + i x slots
    sizes = prepare_call_sizes(len(plan.tasks))
    assert len(sizes) > 1
    firsts = [1_000 + sum(sizes[:c]) for c in range(len(sizes))]
    slots = SlotTable(firsts[0], plan.tasks, later_first_ids=tuple(firsts[1:]))
    assignments = task_assignments(plan, slots)
    options = DirectOptions(
        encode=EncodeOptions(
            batch_id=1,
            partition_count=PARTITIONS,
            batch_bytes_target=1,
            record_max_bytes=1,
            partition_column="p",
        ),
        bucket_uri="file:///nowhere",
        namespace="ns",
        stream_ids=tuple(range(PARTITIONS)),
        stream_epochs=(0,) * PARTITIONS,
        assignments=assignments,
    )
    for task in range(TASKS):  # what every write-pass task looks up
        mine = options.assignment(task)
        assert mine is not None
        descriptions_input.append(
            ObjectDescription(
                task,
                0,
                mine.first_object_id,
                1,
                False,
                tuple(WrittenRange(r.partition, r.base, r.end, 1) for r in mine.ranges),
            )
        )
    winners = check_tiling(plan, slots, descriptions_input)
    elapsed = time.process_time() - started
    assert elapsed < CPU_SECONDS_MAX, f"{elapsed:.1f} CPU s for {TASKS} tasks x {PARTITIONS} partitions"
    assert len(winners) == TASKS
    assert plan.ends == tuple(100 + sum(1 + (t + p) % 3 for t in range(TASKS)) for p in range(PARTITIONS))
    assert [w.object_id for w in winners] == [1_000 + i * slots.slots_per_task for i in range(TASKS)]
    last = assignments[TASKS - 1].ranges
    assert [(r.partition, r.digest) for r in last[:2]] == [
        (0, (TASKS - 1) * PARTITIONS),
        (1, (TASKS - 1) * PARTITIONS + 1),
    ]


def test_a_slot_table_pickles_with_its_index() -> None:
    slots = SlotTable(7, (3, 9, 4), slots_per_task=2)
    again = pickle.loads(pickle.dumps(slots))
    assert again == slots
    assert [again.object_id(t, 1) for t in (3, 9, 4)] == [8, 10, 12]


def test_a_slot_table_of_several_prepare_calls_pickles_with_its_later_first_ids() -> None:
    per_call = tasks_per_prepare_call(2)
    tasks = tuple(range(per_call + 1))
    slots = SlotTable(7, tasks, slots_per_task=2, later_first_ids=(100_000,))
    again = pickle.loads(pickle.dumps(slots))
    assert again == slots
    assert again.object_id(per_call - 1, 1) == 7 + (per_call - 1) * 2 + 1
    assert again.object_id(per_call, 1) == 100_001
