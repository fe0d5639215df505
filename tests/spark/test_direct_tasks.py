"""The direct path's executor write pass without Spark: objects with absolute offsets, slots, digests.

A real local object store (``file://``); the objects are opened with the object format's reader and
their Kafka batches decoded, so what a task uploads is checked byte for byte against its rows.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from s3stream.objectformat import ObjectReader, object_key
from s3stream.storage.local import LocalObjectStorage
from spark_sink.direct_digest import DIGEST_COLUMN, rows_digest
from spark_sink.direct_protocol import SlotTable, TaskAssignment, TaskCount, plan_bases, task_assignments
from spark_sink.direct_tasks import DirectOptions, write_partition
from spark_sink.encode import PARTITION_COLUMN, TIMESTAMP_MS_COLUMN, EncodeOptions
from spark_sink.kafka_codec import decode_batch

NS = "ns"


def _hash(value: bytes) -> int:
    """A stand-in for Spark's xxhash64: any signed 64-bit value per row."""
    return int.from_bytes(hashlib.blake2b(value, digest_size=8).digest(), "big", signed=True)


def _rows(ids: range, partitions: int, *, salt: str = "") -> pa.RecordBatch:
    values = [f"{i}:{salt}".encode() + b"v" * (100 - len(salt)) for i in ids]
    return pa.RecordBatch.from_pydict(
        {
            PARTITION_COLUMN: pa.array([i % partitions for i in ids], pa.int32()),
            "key": pa.array([str(i).encode() for i in ids], pa.binary()),
            "value": pa.array(values, pa.binary()),
            TIMESTAMP_MS_COLUMN: pa.array([1_700_000_000_000 + i for i in ids], pa.int64()),
            DIGEST_COLUMN: pa.array([_hash(v) for v in values], pa.int64()),
        }
    )


def _encode_options(partitions: int) -> EncodeOptions:
    return EncodeOptions(
        batch_id=4,
        partition_count=partitions,
        batch_bytes_target=2048,
        record_max_bytes=4096,
        partition_column="p",
    )


def _counts(task: int, batches: list[pa.RecordBatch], partitions: int) -> list[TaskCount]:
    """What the count pass (a Spark aggregation) reports for these rows."""
    table = pa.Table.from_batches(batches)
    out = []
    for p in range(partitions):
        mine = table.filter(pa.compute.equal(table.column(PARTITION_COLUMN), p))
        if mine.num_rows:
            size = sum(
                len(k) + len(v)
                for k, v in zip(mine["key"].to_pylist(), mine["value"].to_pylist(), strict=True)
            )
            out.append(TaskCount(task, p, mine.num_rows, size, rows_digest(mine.column(DIGEST_COLUMN))))
    return out


def _options(root: Path, counts: list[TaskCount], partitions: int, ends: list[int]) -> DirectOptions:
    plan = plan_bases(counts, ends)
    return DirectOptions(
        encode=_encode_options(partitions),
        bucket_uri=f"file://{root}",
        namespace=NS,
        stream_ids=tuple(10 + (partitions - 1 - p) for p in range(partitions)),  # descending stream ids
        stream_epochs=(3,) * partitions,
        assignments=task_assignments(plan, SlotTable(100, plan.tasks, slots_per_task=4)),
        slots_per_task=4,
    )


def _assigned(options: DirectOptions, task: int) -> TaskAssignment:
    got = options.assignment(task)
    assert got is not None
    return got


def _decoded(root: Path, object_id: int, size: int) -> dict[int, list[tuple[int, bytes]]]:
    """stream id -> [(offset, key)] read back from the object."""

    async def read() -> dict[int, list[tuple[int, bytes]]]:
        storage = LocalObjectStorage(str(root))
        reader = await ObjectReader.open(storage, object_key(object_id, NS), size)
        out: dict[int, list[tuple[int, bytes]]] = {}
        blocks = await reader.read_blocks(reader.index)
        for block in blocks:
            for rec in block.records:
                assert rec.epoch == 3
                decoded, _ = decode_batch(rec.payload, source="t", base_offset=rec.base_offset)
                assert decoded.offsets[0] == rec.base_offset  # the Kafka header holds the absolute offset
                out.setdefault(rec.stream_id, []).extend(
                    (o, k or b"") for o, k in zip(decoded.offsets, decoded.keys, strict=True)
                )
        await storage.close()
        return out

    return asyncio.run(read())


def _write(options: DirectOptions, task: int, attempt: int, batches: list[pa.RecordBatch]) -> dict[str, Any]:
    rows: list[dict[str, Any]] = [
        r for rb in write_partition(options, task, attempt, iter(batches)) for r in rb.to_pylist()
    ]
    assert len(rows) == 1
    return rows[0]


def test_a_task_writes_one_streamset_object_at_its_planned_offsets(tmp_path: Path) -> None:
    batches = [_rows(range(0, 300), 2), _rows(range(300, 320), 2)]
    counts = _counts(1, batches, 2)
    options = _options(tmp_path, [TaskCount(0, 0, 7, 1), TaskCount(0, 1, 3, 1), *counts], 2, [50, 60])
    row = _write(options, 1, 0, batches)
    assert row["error"] is None
    assert row["slot"] == 0
    assert row["object_id"] == _assigned(options, 1).first_object_id
    assert row["stream_object"] is False
    ranges = json.loads(str(row["ranges"]))
    assert [r[:3] for r in ranges] == [[0, 57, 57 + 160], [1, 63, 63 + 160]]
    got = _decoded(tmp_path, int(row["object_id"]), int(row["size_bytes"]))
    # partition 0 is stream 11, partition 1 is stream 10: the object holds stream 10 first
    assert got[11] == [(57 + j, str(i).encode()) for j, i in enumerate(range(0, 320, 2))]
    assert got[10] == [(63 + j, str(i).encode()) for j, i in enumerate(range(1, 320, 2))]


def test_a_task_of_one_partition_writes_a_stream_object(tmp_path: Path) -> None:
    batches = [_rows(range(0, 50), 1)]
    options = _options(tmp_path, _counts(0, batches, 1), 1, [0])
    row = _write(options, 0, 0, batches)
    assert row["stream_object"] is True
    got = _decoded(tmp_path, int(row["object_id"]), int(row["size_bytes"]))
    assert [o for o, _ in got[10]] == list(range(50))


def test_attempts_write_distinct_objects(tmp_path: Path) -> None:
    batches = [_rows(range(0, 20), 1)]
    options = _options(tmp_path, _counts(0, batches, 1), 1, [0])
    first = _write(options, 0, 0, batches)
    retry = _write(options, 0, 1, batches)
    assert first["object_id"] != retry["object_id"]
    assert (tmp_path / object_key(int(first["object_id"]), NS)).exists()


def test_an_attempt_past_the_last_slot_fails_the_batch(tmp_path: Path) -> None:
    batches = [_rows(range(0, 20), 1)]
    options = _options(tmp_path, _counts(0, batches, 1), 1, [0])
    row = _write(options, 0, 4, batches)
    assert "no free object id slot" in str(row["error"])
    assert not any(tmp_path.rglob("*/ns/*"))


def test_rows_that_changed_since_the_count_pass_fail_the_batch_without_an_object(tmp_path: Path) -> None:
    counted = [_rows(range(0, 20), 2)]
    options = _options(tmp_path, _counts(0, counted, 2), 2, [0, 0])
    row = _write(options, 0, 0, [_rows(range(0, 21), 2)])
    assert "changed between the passes" in str(row["error"])
    assert not any(tmp_path.rglob("*/ns/*"))


def test_other_rows_with_the_same_counts_fail_the_batch_without_an_object(tmp_path: Path) -> None:
    # a non-deterministic recompute: as many rows per partition, other values
    counted = [_rows(range(0, 20), 2)]
    options = _options(tmp_path, _counts(0, counted, 2), 2, [0, 0])
    row = _write(options, 0, 0, [_rows(range(0, 20), 2, salt="x")])
    assert "row digest of partition(s) [0, 1] differs" in str(row["error"])
    assert not any(tmp_path.rglob("*/ns/*"))


def test_the_digest_ignores_row_order_and_batch_boundaries(tmp_path: Path) -> None:
    counted = [_rows(range(0, 30), 2)]
    options = _options(tmp_path, _counts(0, counted, 2), 2, [0, 0])
    shuffled = [_rows(range(29, 9, -1), 2), _rows(range(0, 10), 2)]
    row = _write(options, 0, 0, shuffled)
    assert row["error"] is None


@pytest.mark.parametrize("step", ["after_encode", "after_upload"])
def test_the_task_observer_sees_each_step(tmp_path: Path, step: str) -> None:
    seen: list[tuple[str, int, int, int]] = []

    def observe(name: str, batch_id: int, task: int, attempt: int) -> None:
        seen.append((name, batch_id, task, attempt))
        if name == step:
            raise RuntimeError("injected")

    batches = [_rows(range(0, 10), 1)]
    options = _options(tmp_path, _counts(2, batches, 1), 1, [0])
    from dataclasses import replace

    options = replace(options, task_observer=observe)
    gen: Iterator[pa.RecordBatch] = write_partition(options, 2, 1, iter(batches))
    with pytest.raises(RuntimeError, match="injected"):
        list(gen)
    assert seen[-1] == (step, 4, 2, 1)


def test_an_attempt_whose_slot_is_taken_moves_to_the_next_slot(tmp_path: Path) -> None:
    # a stage re-attempt starts again at attempt number 0: the earlier attempt's object stays
    batches = [_rows(range(0, 20), 1)]
    options = _options(tmp_path, _counts(0, batches, 1), 1, [0])
    first = _write(options, 0, 0, batches)
    first_key = tmp_path / object_key(int(first["object_id"]), NS)
    before = first_key.read_bytes()
    again = _write(options, 0, 0, batches)
    assert again["slot"] == 1
    assert again["object_id"] == _assigned(options, 0).first_object_id + 1
    assert first_key.read_bytes() == before, "create-only: the first attempt's object is never replaced"
