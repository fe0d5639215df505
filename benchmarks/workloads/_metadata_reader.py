"""The ``metadata`` workload's reader row: catch-up from another process vs raw ranged GETs of the same bytes.

:func:`reader_rows` (in the workload's process): an engine whose metadata store is the subject's URL
writes ``reader_mib`` MiB of 1 KiB records into one stream of the target's object store, uploads
everything and closes; the stream's byte span in each object (its data blocks, from the object's
index) is read once, untimed. Then a separate process (``python -m benchmarks.workloads._metadata_reader``,
its :class:`ReaderSpec` as JSON in :data:`SPEC_ENV`) makes ``rounds`` pairs of passes in alternating
order, each starting on a collected heap:

- **reader**: ``s3stream.open_reader(bucket_uri=..., metadata_url=...)`` (where the package has it;
  else the same parts by hand: the metadata store by URL, an object-store client and the engine's
  object read path, :func:`s3stream.assembly.build_reader`; empty block and index caches, default readahead; no data dir, no WAL),
  ``fetch`` of ``[0, end)`` in 1 MiB fetches, close. All of it is timed: the opens, the metadata
  queries, the index reads, the block GETs, the CRC checks and decoding into record batches.
- **raw**: a plain object-store client fetching the same spans with ranged GETs of 4 MiB,
  :data:`RAW_INFLIGHT` at a time (the body read chunk by chunk and joined, as the engine's storage
  does); nothing decoded. On the local store, its ``get``.

An unmeasured raw pass warms the server first. Each side's best pass is the figure (MB/s of the spans'
bytes), both medians in the extras.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import s3stream
from benchmarks.core import Context, Result
from benchmarks.pgserver import REPO_ROOT
from benchmarks.workloads._metadata_node import open_store
from s3stream.assembly import build_reader, open_client
from s3stream.config import Config
from s3stream.ids import StreamId
from s3stream.metadata.controller import GET_LIMIT_MAX
from s3stream.model import RecordBatch
from s3stream.objectformat import ObjectReader, object_key
from s3stream.storage.base import ObjectStorage
from s3stream.storage.s3 import S3Config, S3ObjectStorage

SPEC_ENV = "S3STREAM_BENCH_METADATA_READER"
KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
FETCH_MAX_BYTES = 1 * MiB
RAW_GET_BYTES = 4 * MiB
RAW_INFLIGHT = 16
WRITE_PRODUCERS = 64
READER_TIMEOUT_S = 1800.0
W = "metadata"


@dataclass(frozen=True)
class ReaderSpec:
    url: str
    bucket_uri: str
    """The same store as ``storage``, as ``s3stream.open_reader`` takes it."""
    storage: dict[str, Any]
    """``{"s3": S3Config fields}`` or ``{"local_root": path}``."""
    namespace: str
    stream_id: int
    end_offset: int
    spans: list[tuple[str, int, int]]
    """Each object's ``(key, start, end)`` bytes of the stream's data blocks."""
    rounds: int
    cpu: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _storage_spec(ctx: Context, name: str) -> dict[str, Any]:
    """What :func:`_open_storage` needs to open ``ctx.open_storage(name)``'s store in another process."""
    if ctx.s3 is None:
        return {"local_root": str(ctx.scratch(f"objects-{name}"))}
    return {
        "s3": {
            "bucket": ctx.s3.bucket,
            "endpoint": ctx.s3.endpoint,
            "region": ctx.s3.region,
            "path_style": True,
            "access_key": ctx.s3.access_key,
            "secret_key": ctx.s3.secret_key,
            "prefix": ctx.key_prefix(name),
            "checksum_mode": os.environ.get("S3STREAM_BENCH_CHECKSUM_MODE", "when_required"),
        }
    }


def _open_storage(spec: dict[str, Any]) -> ObjectStorage:
    if "s3" in spec:
        return S3ObjectStorage(S3Config(**spec["s3"]))
    from s3stream.storage.local import LocalObjectStorage

    return LocalObjectStorage(Path(spec["local_root"]))


async def _write(ctx: Context, url: str, storage: ObjectStorage, total_bytes: int) -> tuple[StreamId, int]:
    """One stream of ``total_bytes`` of 1 KiB records, all uploaded; returns its id and end offset."""
    data_dir = ctx.scratch("reader-writer")
    store = await open_store(url)
    client = await open_client(data_dir, config=Config(), storage=storage, metadata=store)
    try:
        stream = await client.streams.create_and_open_stream()
        appends = total_bytes // KiB
        payload = os.urandom(KiB)

        async def producer(index: int) -> None:
            for _ in range(index, appends, WRITE_PRODUCERS):
                await stream.append(RecordBatch(payload))

        await asyncio.gather(*(producer(i) for i in range(WRITE_PRODUCERS)))
        await client.engine.force_upload(None)
        return stream.stream_id, stream.next_offset
    finally:
        await client.close()


async def _spans(url: str, storage: ObjectStorage, namespace: str, stream_id: StreamId, end: int) -> list[tuple[str, int, int]]:  # fmt: skip
    store = await open_store(url)
    try:
        slices = await store.get_objects(
            stream_id=stream_id, start_offset=0, end_offset=end, limit=GET_LIMIT_MAX
        )
    finally:
        await store.close()
    if not slices or slices[-1].end_offset != end:
        raise RuntimeError(f"the stream's objects end at {slices[-1].end_offset if slices else 0}, not {end}")
    spans = []
    for piece in slices:
        key = object_key(piece.object_id, namespace)
        mine = [
            e
            for e in (await ObjectReader.open(storage, key, piece.size_bytes)).index
            if e.stream_id == stream_id
        ]
        spans.append((key, mine[0].start_position, mine[-1].end_position))
    return spans


async def reader_rows(ctx: Context, url: str, *, label: str) -> list[Result]:
    total_bytes = ctx.param("reader_mib", ctx.scale(quick=8, full=128)) * MiB
    rounds = ctx.param("reader_rounds", ctx.scale(quick=2, full=4))
    namespace = Config().namespace
    storage_spec = _storage_spec(ctx, "reader")
    ctx.status(f"metadata: writing {total_bytes >> 20} MiB of 1 KiB records for the reader")
    writer_storage = _open_storage(storage_spec)  # the client closes it
    if isinstance(writer_storage, S3ObjectStorage):
        await writer_storage.connect()
    stream_id, end = await _write(ctx, url, writer_storage, total_bytes)
    storage = _open_storage(storage_spec)
    try:
        if isinstance(storage, S3ObjectStorage):
            await storage.connect()
        spans = await _spans(url, storage, namespace, stream_id, end)
    finally:
        await storage.close()
    cpus = ctx.cpus_for_children()
    spec = ReaderSpec(
        url=url,
        bucket_uri=ctx.s3.uri(ctx.key_prefix("reader")) if ctx.s3 else f"file://{storage_spec['local_root']}",
        storage=storage_spec,
        namespace=namespace,
        stream_id=stream_id,
        end_offset=end,
        spans=spans,
        rounds=rounds,
        cpu=cpus[-1] if ctx.pin else None,
    )
    ctx.status(f"metadata: reader catch-up in another process vs raw ranged GETs, {rounds} rounds")
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "benchmarks.workloads._metadata_reader",
        cwd=REPO_ROOT,
        env={**os.environ, SPEC_ENV: json.dumps(asdict(spec))},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), READER_TIMEOUT_S)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    if process.returncode != 0:
        raise RuntimeError(
            f"the reader process failed ({process.returncode}):\n{err.decode(errors='replace')[-3000:]}"
        )
    report = json.loads(out.strip().splitlines()[-1])
    span_bytes = sum(b - a for _, a, b in spans)
    reader_s, raw_s = report["reader_s"], report["raw_s"]
    return [
        Result(
            W,
            f"reader catch-up MB/s from another process, 1 KiB records, {label} metadata",
            span_bytes / min(reader_s) / 1e6,
            "MB/s",
            f"raw ranged GETs of the same bytes from that process, {RAW_GET_BYTES >> 20} MiB each, {RAW_INFLIGHT} in flight",
            span_bytes / min(raw_s) / 1e6,
            True,
            {
                "subject": f"{report['reader_api']} over {label} metadata (no data dir, no WAL)",
                "reader_median_mb_s": span_bytes / statistics.median(reader_s) / 1e6,
                "raw_median_mb_s": span_bytes / statistics.median(raw_s) / 1e6,
                "reader_s_rounds": reader_s,
                "raw_s_rounds": raw_s,
                "reader_cpu_s_per_gib": [c / (span_bytes / GiB) for c in report["reader_cpu_s"]],
                "raw_cpu_s_per_gib": [c / (span_bytes / GiB) for c in report["raw_cpu_s"]],
                "span_bytes": span_bytes,
                "objects": len(spans),
                "payload_bytes": total_bytes,
                "end_offset": end,
                "payload_bytes_read": report["payload_bytes"],
                "backend": "s3" if ctx.s3 is not None else "local",
                "goal_ratio": 0.7,
                "pinned": ctx.pin,
            },
        )
    ]


# --- the reader process ------------------------------------------------------------------------------


async def _reader_pass(spec: ReaderSpec) -> tuple[float, int]:
    """Open a reader, fetch ``[0, end)``, close: seconds and payload bytes. The reader is
    ``s3stream.open_reader`` where the package has it, else the same parts by hand (the metadata store
    by URL, an object-store client, :func:`s3stream.assembly.build_reader`)."""
    started = time.perf_counter()
    payload_bytes, offset, stream_id = 0, 0, StreamId(spec.stream_id)
    open_reader = getattr(s3stream, "open_reader", None)
    if open_reader is not None:
        reader = await open_reader(bucket_uri=spec.bucket_uri, metadata_url=spec.url, config=Config())
        fetch, closers = reader.fetch, [reader.close]
    else:
        store = await open_store(spec.url)
        storage = _open_storage(spec.storage)
        if isinstance(storage, S3ObjectStorage):
            await storage.connect()
        path = build_reader(Config(), store, storage)
        fetch, closers = path.read, [path.close, storage.close, store.close]
    try:
        while offset < spec.end_offset:
            batches = await fetch(stream_id, offset, spec.end_offset, FETCH_MAX_BYTES)
            if not batches:
                raise RuntimeError(f"the read stopped at offset {offset} of {spec.end_offset}")
            payload_bytes += sum(len(b.payload) for b in batches)
            offset = batches[-1].end_offset
    finally:
        for close in closers:
            await close()
    return time.perf_counter() - started, payload_bytes


async def _raw_pass(spec: ReaderSpec) -> float:
    """The spans by ranged GETs of :data:`RAW_GET_BYTES`, :data:`RAW_INFLIGHT` in flight: seconds."""
    started = time.perf_counter()
    storage = _open_storage(spec.storage)
    gate = asyncio.Semaphore(RAW_INFLIGHT)

    async def get(key: str, start: int, end: int) -> int:
        async with gate:
            return len(await storage.get(key, start, end))

    try:
        if isinstance(storage, S3ObjectStorage):
            await storage.connect()
        ranges = [
            (k, a, min(a + RAW_GET_BYTES, b)) for k, s, b in spec.spans for a in range(s, b, RAW_GET_BYTES)
        ]
        got = sum(await asyncio.gather(*(get(*r) for r in ranges)))
    finally:
        await storage.close()
    if got != sum(b - a for _, a, b in spec.spans):
        raise RuntimeError(
            f"raw GETs read {got} bytes, not the spans' {sum(b - a for _, a, b in spec.spans)}"
        )
    return time.perf_counter() - started


async def _passes(spec: ReaderSpec) -> dict[str, Any]:
    if spec.cpu is not None:
        os.sched_setaffinity(0, {spec.cpu})
    await _raw_pass(spec)  # warms the server; unmeasured
    reader_s: list[float] = []
    raw_s: list[float] = []
    cpu_s: dict[str, list[float]] = {"reader": [], "raw": []}
    payload_bytes = 0
    for index in range(spec.rounds):
        for side in ("reader", "raw") if index % 2 == 0 else ("raw", "reader"):
            gc.collect()  # each side pays for collecting its own garbage only
            cpu_started_s = time.process_time()
            if side == "reader":
                elapsed, payload_bytes = await _reader_pass(spec)
                reader_s.append(elapsed)
            else:
                raw_s.append(await _raw_pass(spec))
            cpu_s[side].append(time.process_time() - cpu_started_s)
    api = "s3stream.open_reader" if hasattr(s3stream, "open_reader") else "build_reader (no open_reader yet)"
    return {
        "reader_s": reader_s,
        "raw_s": raw_s,
        "reader_cpu_s": cpu_s["reader"],
        "raw_cpu_s": cpu_s["raw"],
        "payload_bytes": payload_bytes,
        "reader_api": api,
    }


def main() -> None:
    from s3stream._loop import run as run_loop

    raw = json.loads(os.environ[SPEC_ENV])
    raw["spans"] = [tuple(s) for s in raw["spans"]]
    print(json.dumps(run_loop(_passes(ReaderSpec(**raw)))), flush=True)


if __name__ == "__main__":
    main()
