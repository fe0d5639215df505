"""Workload ``compaction``: StreamSet compaction throughput vs raw GET + PUT of the same bytes (goal
>= 0.5x), peak memory with an input 10x the memory budget (goal <= budget + 10 %), objects and
metadata rows before and after.

Input: ``objects`` StreamSet objects written straight through the object writer and committed to a
SQLite metadata store like WAL uploads; each holds a slice of every one of ``streams`` streams (a few
"hot" streams large enough to be split into stream objects, the rest merged into one new StreamSet
object). Total input = 10 x the budget (``s3.stream.set.object.compaction.cache.size``).

* throughput: one ``Compactor.run_once`` (StreamSet pass) over the input, MiB of input per second;
  baseline: GET every input object whole, then PUT the same bytes under new keys, 8 requests in
  flight (compaction's own read concurrency), through the same ObjectStorage;
* peak memory: the same compaction over a second, identical input with ``tracemalloc`` on: the peak
  of Python-allocated bytes above what was allocated before it started (the data buffers, the
  writer buffers, the storage client's buffers), against the budget;
* objects and metadata rows (object records + StreamSet ranges + stream objects) before, and after the
  StreamSet pass, a stream object pass (merging the stream objects a step boundary cut) and a GC
  pass with retention 0.
"""

from __future__ import annotations

import asyncio
import os
import time
import tracemalloc
from dataclasses import replace
from pathlib import Path

from benchmarks.core import Context, Result
from benchmarks.measure import ResourceMeter, per_gib
from compaction.compactor import Compactor
from compaction.gc import GarbageCollector
from s3stream.config import Config
from s3stream.ids import NodeId
from s3stream.metadata.base import CommitStreamSetObjectRequest, MetadataStore, ObjectState
from s3stream.metadata.sqlite import SqliteMetadataStore
from s3stream.objectformat import ObjectWriter, object_key
from s3stream.record import StreamRecordBatch
from s3stream.storage.base import ObjectStorage

MiB = 1024 * 1024
WORKLOAD = "compaction"
NODE = NodeId(0)
RECORD_BYTES = 64 * 1024
HOT_STREAMS = 4
BASELINE_CONCURRENCY = 8


async def build_input(
    metadata: MetadataStore,
    storage: ObjectStorage,
    config: Config,
    *,
    objects: int,
    streams: int,
    total_bytes: int,
) -> None:
    """Write and commit the input (module docstring); also used by tests/integration/test_compaction_s3.py."""
    await metadata.register_node(node_id=NODE, node_epoch=1)
    ids = [await metadata.create_stream(node_id=NODE, node_epoch=1) for _ in range(streams)]
    for sid in ids:
        await metadata.open_stream(node_id=NODE, node_epoch=1, stream_id=sid, epoch=0)
    per_object = total_bytes // objects
    hot_share = per_object // 2 // HOT_STREAMS  # half of each object is hot streams
    cold_share = per_object // 2 // (streams - HOT_STREAMS)
    blob = os.urandom(4 * MiB)
    offsets = dict.fromkeys(ids, 0)
    for i in range(objects):
        object_id = await metadata.prepare_objects(count=1, ttl_ms=3_600_000)
        writer = ObjectWriter(
            storage.upload(object_key(object_id, config.namespace)),
            block_size_bytes=config.object_block_size_bytes,
            part_size_bytes=config.object_part_size_bytes,
        )
        for n, sid in enumerate(ids):
            share = hot_share if n < HOT_STREAMS else cold_share
            batches = []
            for j in range(max(1, share // RECORD_BYTES)):
                at = (i * 7919 + n * 104729 + j * RECORD_BYTES) % (len(blob) - RECORD_BYTES)
                batches.append(StreamRecordBatch(sid, 0, offsets[sid], 1, blob[at : at + RECORD_BYTES]))
                offsets[sid] += 1
            await writer.write(batches)
        written = await writer.close()
        await metadata.commit_stream_set_object(
            CommitStreamSetObjectRequest(
                node_id=NODE,
                node_epoch=1,
                object_id=object_id,
                order_id=object_id,
                object_size_bytes=written.size_bytes,
                stream_ranges=written.stream_ranges,
            )
        )


async def _counts(metadata: MetadataStore) -> tuple[int, int]:
    """(live objects, metadata rows = object records + StreamSet ranges + stream objects)."""
    objects = await metadata.list_objects([ObjectState.COMMITTED])
    rows = len(await metadata.list_objects())
    for sso in await metadata.get_stream_set_objects(NODE):
        rows += len(sso.ranges)
    for stream in await metadata.list_streams():
        rows += len(
            await metadata.get_stream_objects(
                stream_id=stream.stream_id, start_offset=0, end_offset=-1, limit=100_000
            )
        )
    return len(objects), rows


async def _baseline(storage: ObjectStorage, metadata: MetadataStore, namespace: str) -> tuple[float, int]:
    """Seconds to GET every live object whole and PUT the same bytes under new keys."""
    sizes = {
        object_key(o.object_id, namespace): o.size_bytes
        for o in await metadata.list_objects([ObjectState.COMMITTED])
    }
    slots = asyncio.Semaphore(BASELINE_CONCURRENCY)

    async def copy(key: str) -> None:
        async with slots:
            data = await storage.get(key)
        async with slots:
            await storage.put("baseline/" + key.replace("/", "_"), data)

    started = time.perf_counter()
    await asyncio.gather(*(copy(k) for k in sizes))
    elapsed = time.perf_counter() - started
    await storage.delete(["baseline/" + k.replace("/", "_") for k in sizes])
    return elapsed, sum(sizes.values())


async def _setup(ctx: Context, name: str, config: Config, **kw: int) -> tuple[MetadataStore, ObjectStorage]:
    directory: Path = ctx.scratch(f"{WORKLOAD}-{name}")
    metadata = await SqliteMetadataStore.open(str(directory / "metadata.db"))
    storage = ctx.open_storage(f"{WORKLOAD}-{name}")
    await build_input(metadata, storage, config, **kw)
    return metadata, storage


def _lean_s3(storage: ObjectStorage, part_size_bytes: int) -> ObjectStorage:
    """The same S3 bucket and prefix with multipart parts of ``part_size_bytes``, one in flight."""
    from s3stream.storage.s3 import S3ObjectStorage

    assert isinstance(storage, S3ObjectStorage)
    return S3ObjectStorage(replace(storage.config, part_size_bytes=part_size_bytes, part_concurrency_max=1))


async def run(ctx: Context) -> list[Result]:
    budget = ctx.param("budget_mib", ctx.scale(quick=32, full=64)) * MiB
    objects = ctx.param("objects", ctx.scale(quick=10, full=20))
    streams = ctx.param("streams", 40)
    config = Config(
        stream_set_object_compaction_cache_size_bytes=budget,
        object_part_size_bytes=5 * MiB,
        object_block_size_bytes=512 * 1024,
    )
    total = 10 * budget
    results: list[Result] = []

    ctx.status(f"writing {total // MiB} MiB input ({objects} objects, {streams} streams)")
    metadata, storage = await _setup(
        ctx, "throughput", config, objects=objects, streams=streams, total_bytes=total
    )
    try:
        objects_before, rows_before = await _counts(metadata)
        ctx.status("baseline: raw GET + PUT of the input")
        with ResourceMeter(interval_s=0) as base_meter:
            base_s, input_bytes = await _baseline(storage, metadata, config.namespace)
        ctx.status("compacting")
        compactor = Compactor(config, metadata, storage, node_id=NODE, node_epoch=1)
        started = time.perf_counter()
        with ResourceMeter(interval_s=0) as meter:
            report = await compactor.run_once(stream_objects=False)
        took_s = time.perf_counter() - started
        assert not report.problems, report.problems
        ctx.status("stream object pass: merge the split stream objects")
        started = time.perf_counter()
        so_report = await compactor.run_once(stream_objects=True)
        so_pass_s = time.perf_counter() - started
        ctx.status("GC of the replaced objects (retention 0)")
        gc = await GarbageCollector(metadata, storage, namespace=config.namespace, retention_ms=0,
                                    orphan_ttl_ms=0).collect()  # fmt: skip
        objects_after, rows_after = await _counts(metadata)
        results.append(
            Result(
                WORKLOAD,
                "StreamSet compaction throughput (input MiB/s)",
                input_bytes / MiB / took_s,
                "MiB/s",
                f"raw GET + PUT of the same bytes ({BASELINE_CONCURRENCY} in flight)",
                input_bytes / MiB / base_s,
                extra={"input_mib": input_bytes / MiB, "summary": report.summary(), "goal_ratio": 0.5},
                cpu_s_per_gib=per_gib(meter.usage.cpu_s, input_bytes),
                baseline_cpu_s_per_gib=per_gib(base_meter.usage.cpu_s, input_bytes),
            )
        )
        results.append(
            Result(WORKLOAD, "objects after compaction + GC", objects_after, "objects", "objects before",
                   objects_before, higher_is_better=False,
                   extra={"deleted": gc.deleted_count, "stream_object_pass_s": so_pass_s,
                          "stream_object_pass": so_report.summary()})
        )  # fmt: skip
        results.append(
            Result(WORKLOAD, "metadata rows after compaction + GC", rows_after, "rows", "metadata rows before",
                   rows_before, higher_is_better=False)
        )  # fmt: skip
    finally:
        await metadata.close()
        await storage.close()

    cases: list[tuple[str, bool]] = [("storage defaults", False)]
    if ctx.s3 is not None:
        cases.append((f"S3 multipart parts of {config.object_part_size_bytes // MiB} MiB, 1 in flight", True))
    for label, lean in cases:
        ctx.status(f"peak memory ({label}): fresh input, compaction under tracemalloc")
        metadata, storage = await _setup(
            ctx,
            "memory-lean" if lean else "memory",
            config,
            objects=objects,
            streams=streams,
            total_bytes=total,
        )
        if lean:
            writer_side, storage = storage, _lean_s3(storage, config.object_part_size_bytes)
            await writer_side.close()
        try:
            compactor = Compactor(config, metadata, storage, node_id=NODE, node_epoch=1)
            async for _ in storage.list(
                ""
            ):  # the client's one-time setup (botocore models) is not compaction's
                break
            tracemalloc.start()
            try:
                floor, _ = tracemalloc.get_traced_memory()
                tracemalloc.reset_peak()
                report = await compactor.run_once(stream_objects=False)
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            results.append(
                Result(
                    WORKLOAD,
                    f"peak memory compacting {total // MiB} MiB (10x budget), {label}",
                    (peak - floor) / MiB,
                    "MiB",
                    "memory budget (s3.stream.set.object.compaction.cache.size)",
                    budget / MiB,
                    higher_is_better=False,
                    extra={
                        "goal_ratio_max": 1.1,
                        "bytes_read": report.bytes_read,
                        "summary": report.summary(),
                    },
                )
            )
        finally:
            await metadata.close()
            await storage.close()
    if ctx.s3 is not None:
        ctx.notes.append(
            "compaction peak memory on S3 includes the multipart upload layer: compaction gives each upload "
            "its share of the budget as buffer_max_bytes (StreamSet object: the reserve; stream objects: the "
            "step), and the upload sizes its parts and parts in flight to stay under it, so the default S3 "
            "settings (16 MiB parts, 4 in flight) meet the budget too; the second memory figure forces 5 MiB "
            "parts, 1 in flight on every upload, for comparison; botocore's one-time model loading is excluded"
        )
    return results
