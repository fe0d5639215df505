"""Baselines every workload measures in the same run as its own figure.

- :func:`odirect_write`: raw sequential O_DIRECT write of N bytes to a file (aligned mmap buffer,
  ``os.pwrite``, one ``fdatasync`` at the end): the disk's ceiling for the WAL.
- :func:`raw_s3_put_get`: N objects of S bytes PUT then GET with concurrency C through a plain
  aiobotocore client: the object store's ceiling for uploads and catch-up reads.
- :func:`raw_put_ceiling`: the best of single PUTs and multipart uploads in the engine's shape, warmed
  up, best of alternating rounds: what the engine's upload rate is held against.
- :func:`naive_writer`: durable writes where every flush PUTs one object per stream that has data
  (what a writer without a WAL or StreamSet objects does): the design the engine must beat.
- :func:`slatedb_writer`: the same durable writes through SlateDB (``slatedb`` on PyPI) on the same
  object store: a peer engine (an LSM with its WAL on object storage).

The two durable writers share :class:`DurableWriteSpec`: ``producer_count`` producers each append a
record of ``record_bytes`` to one of ``stream_count`` streams and wait until it is durable, then the
next; ``warmup_s`` is discarded, ``duration_s`` is measured. Each call returns a :class:`Measured`.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import mmap
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.core import S3Target
from benchmarks.measure import (
    MIB,
    LatencyRecorder,
    RequestCounter,
    ResourceMeter,
    ResourceUsage,
    per_gib,
    throughput,
)
from s3stream.storage.base import ObjectStorage

SLATEDB_STEP_TIMEOUT_S = 120.0
"""Opening SlateDB, closing it, and its writes past the deadline each get this long (a stuck object
store must fail the workload, not hang it)."""
ALIGN_BYTES = 4096
"""O_DIRECT buffer, offset and length alignment (the logical block size of every disk we run on)."""


@dataclass
class Measured:
    """One measured run of a baseline (or of the engine, in the same shape)."""

    name: str
    payload_bytes: int = 0
    op_count: int = 0
    elapsed_s: float = 0.0
    latency: LatencyRecorder = field(default_factory=LatencyRecorder)
    requests: RequestCounter | None = None
    usage: ResourceUsage | None = None
    notes: list[str] = field(default_factory=list)
    written_bytes: int = 0
    """Every payload byte written, warm-up included (requests per GiB divide by it); 0: payload_bytes."""

    @property
    def request_base_bytes(self) -> int:
        return self.written_bytes or self.payload_bytes

    @property
    def mib_per_s(self) -> float:
        return throughput(self.payload_bytes / MIB, self.elapsed_s)

    @property
    def mb_per_s(self) -> float:
        return throughput(self.payload_bytes / 1e6, self.elapsed_s)

    @property
    def ops_per_s(self) -> float:
        return throughput(self.op_count, self.elapsed_s)

    def extra(self, prefix: str = "baseline_") -> dict[str, Any]:
        """This run as ``Result.extra`` entries (``<prefix>latency_ms``, ...)."""
        out: dict[str, Any] = {
            f"{prefix}name": self.name,
            f"{prefix}latency_ms": self.latency.summary_ms(),
            f"{prefix}payload_bytes": self.payload_bytes,
            f"{prefix}op_count": self.op_count,
            f"{prefix}elapsed_s": self.elapsed_s,
        }
        if self.requests is not None:
            out[f"{prefix}s3_requests_per_gib"] = self.requests.per_gib(self.request_base_bytes)
            out[f"{prefix}s3_requests"] = self.requests.snapshot()["by_class"]
        if self.usage is not None:
            out.update({f"{prefix}{key}": value for key, value in self.usage.to_extra().items()})
        if self.notes:
            out[f"{prefix}notes"] = list(self.notes)
        return out


# --- raw O_DIRECT write ----------------------------------------------------------------------------


def odirect_write_sync(path: Path, *, total_bytes: int, block_bytes: int = MIB) -> Measured:
    """Write ``total_bytes`` sequentially to a new file at ``path`` with O_DIRECT, then fdatasync.

    Falls back to buffered writes (noted in the result) where the filesystem refuses O_DIRECT
    (tmpfs). The file is removed afterwards.
    """
    if block_bytes <= 0 or block_bytes % ALIGN_BYTES or total_bytes <= 0:
        raise ValueError(f"block_bytes must be a positive multiple of {ALIGN_BYTES}, total_bytes positive")
    total_bytes = -(-total_bytes // block_bytes) * block_bytes
    result = Measured(name=f"raw O_DIRECT sequential write ({block_bytes // 1024} KiB writes)")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    try:
        fd = os.open(path, flags | getattr(os, "O_DIRECT", 0), 0o644)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        fd = os.open(path, flags, 0o644)
        result.notes.append("the filesystem refused O_DIRECT: buffered writes + fdatasync instead")
        result.name = f"raw buffered sequential write + fdatasync ({block_bytes // 1024} KiB writes)"
    buffer = mmap.mmap(-1, block_bytes)  # anonymous mappings are page aligned
    buffer.write(os.urandom(block_bytes))
    view = memoryview(buffer)
    try:
        with ResourceMeter() as meter:
            started = time.perf_counter()
            offset = 0
            while offset < total_bytes:
                write_started = time.perf_counter()
                written = os.pwrite(fd, view, offset)
                result.latency.record(time.perf_counter() - write_started)
                if written != block_bytes:
                    raise OSError(errno.EIO, f"short O_DIRECT write: {written} of {block_bytes} bytes")
                offset += written
            os.fdatasync(fd)
            result.elapsed_s = time.perf_counter() - started
        result.usage = meter.usage
        result.payload_bytes = total_bytes
        result.op_count = total_bytes // block_bytes
    finally:
        view.release()
        buffer.close()
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    return result


async def odirect_write(path: Path, *, total_bytes: int, block_bytes: int = MIB) -> Measured:
    """:func:`odirect_write_sync` on a worker thread (the event loop stays free)."""
    return await asyncio.to_thread(odirect_write_sync, path, total_bytes=total_bytes, block_bytes=block_bytes)


# --- raw aiobotocore PUT / GET ---------------------------------------------------------------------


@contextlib.asynccontextmanager
async def raw_s3_client(target: S3Target, counter: RequestCounter | None = None) -> AsyncIterator[Any]:
    """A plain aiobotocore S3 client for ``target`` (path-style), counting requests into ``counter``."""
    from aiobotocore.session import get_session

    async with get_session().create_client("s3", **target.client_kwargs()) as client:
        if counter is not None:
            counter.attach(client)
        yield client


async def raw_s3_put_get(
    target: S3Target,
    *,
    prefix: str,
    object_count: int,
    object_bytes: int,
    concurrency: int,
    get: bool = True,
    cleanup: bool = True,
    warmup_count: int | None = None,
) -> tuple[Measured, Measured | None]:
    """PUT ``object_count`` objects of ``object_bytes`` under ``prefix`` with ``concurrency`` in flight,
    then (``get``) GET them all back the same way. Returns (put, get).

    A warm-up first PUTs and GETs ``warmup_count`` objects (default: ``concurrency``, at most 8) that
    are not measured, so connection set-up stays out of the figures."""
    if min(object_count, object_bytes, concurrency) <= 0:
        raise ValueError("object_count, object_bytes and concurrency must be positive")
    body = os.urandom(object_bytes)
    keys = [f"{prefix}raw-{i:06d}" for i in range(object_count)]
    warm_keys = [
        f"{prefix}warm-{i:06d}" for i in range(min(concurrency, 8) if warmup_count is None else warmup_count)
    ]
    size = _size_label(object_bytes)
    put = Measured(name=f"raw aiobotocore PUT {size} c={concurrency}", requests=RequestCounter())
    got = Measured(name=f"raw aiobotocore GET {size} c={concurrency}", requests=RequestCounter())
    limit = asyncio.Semaphore(concurrency)
    async with raw_s3_client(target) as client:

        async def put_one(key: str) -> None:
            async with limit:
                started = time.perf_counter()
                await client.put_object(Bucket=target.bucket, Key=key, Body=body)
                put.latency.record(time.perf_counter() - started)

        async def get_one(key: str) -> None:
            async with limit:
                started = time.perf_counter()
                response = await client.get_object(Bucket=target.bucket, Key=key)
                async with response["Body"] as stream:
                    data = await stream.read()
                got.latency.record(time.perf_counter() - started)
                if len(data) != object_bytes:
                    raise RuntimeError(f"GET {key}: {len(data)} bytes, expected {object_bytes}")

        async def warm_one(key: str) -> None:
            async with limit:
                await client.put_object(Bucket=target.bucket, Key=key, Body=body)
                if get:
                    response = await client.get_object(Bucket=target.bucket, Key=key)
                    async with response["Body"] as stream:
                        await stream.read()

        try:
            await asyncio.gather(*(warm_one(key) for key in warm_keys))
            assert put.requests is not None
            assert got.requests is not None
            put.requests.attach(client)
            with ResourceMeter() as meter:
                started = time.perf_counter()
                await asyncio.gather(*(put_one(key) for key in keys))
                put.elapsed_s = time.perf_counter() - started
            put.usage, put.payload_bytes, put.op_count = (
                meter.usage,
                object_bytes * object_count,
                object_count,
            )
            put.requests.detach(client)
            if get:
                got.requests.attach(client)
                with ResourceMeter() as meter:
                    started = time.perf_counter()
                    await asyncio.gather(*(get_one(key) for key in keys))
                    got.elapsed_s = time.perf_counter() - started
                got.usage, got.payload_bytes, got.op_count = (
                    meter.usage,
                    object_bytes * object_count,
                    object_count,
                )
                got.requests.detach(client)
        finally:
            if cleanup:
                written = warm_keys + keys
                for start in range(0, len(written), 1000):
                    batch = written[start : start + 1000]
                    await client.delete_objects(
                        Bucket=target.bucket,
                        Delete={"Objects": [{"Key": key} for key in batch], "Quiet": True},
                    )
    return put, (got if get else None)


@dataclass(frozen=True)
class PutCeilingSpec:
    """The request shapes :func:`raw_put_ceiling` measures: single PutObjects of ``put_bytes``, and
    multipart uploads of ``object_bytes`` objects in ``part_bytes`` parts (all parts of an object at
    once), ``concurrency`` PUTs or objects in flight. The defaults are the engine's: 16 MiB parts
    (``s3.object.part.size``), objects of the 32 MiB upload threshold, 4 uploads in flight."""

    total_bytes: int
    """Bytes each shape PUTs per round."""
    put_bytes: int = 16 * MIB
    object_bytes: int = 32 * MIB
    part_bytes: int = 16 * MIB
    concurrency: int = 4
    rounds: int = 2

    def __post_init__(self) -> None:
        if min(self.total_bytes, self.put_bytes, self.object_bytes, self.concurrency, self.rounds) <= 0:
            raise ValueError(f"every PutCeilingSpec size and count must be positive: {self}")
        if not 5 * MIB <= self.part_bytes <= self.object_bytes:
            raise ValueError(f"part_bytes must be in [5 MiB, object_bytes]: {self}")

    def shapes(self, multipart: bool) -> list[str]:
        single = f"PutObject {_size_label(self.put_bytes)}, {self.concurrency} in flight"
        many = (
            f"multipart {_size_label(self.object_bytes)} objects in {_size_label(self.part_bytes)} parts, "
            f"{self.concurrency} objects in flight"
        )
        return [single, many] if multipart else [single]

    def label(self, multipart: bool) -> str:
        return "best of " + " / ".join(self.shapes(multipart))


async def raw_put_ceiling(
    storage: ObjectStorage, target: S3Target | None, *, prefix: str, spec: PutCeilingSpec
) -> Measured:
    """The best PUT rate a plain client gets from the object store, for the engine's upload figures.

    Two request shapes (:class:`PutCeilingSpec`), each warmed up unmeasured first (client, connections,
    a server that was idle), then ``spec.rounds`` rounds of ``spec.total_bytes`` alternating which
    shape goes first; the best round of the best shape is the result (its notes hold every round):

    - single PutObjects through ``storage.put`` (on S3 one PutObject whose SHA-256 is computed off
      the event loop; the local store's put otherwise);
    - multipart uploads straight through aiobotocore under ``prefix`` of ``target``'s bucket (what a
      raw client does with objects the engine's size), only when ``target`` is given.

    Every object is deleted after its round (outside the timing), so the store does not fill up."""
    put_body = os.urandom(spec.put_bytes)
    object_body = os.urandom(spec.object_bytes)
    shapes = spec.shapes(multipart=target is not None)
    rates: dict[str, list[float]] = {shape: [] for shape in shapes}
    best = Measured(name="")
    best_rate = -1.0
    async with contextlib.AsyncExitStack() as stack:
        client = await stack.enter_async_context(raw_s3_client(target)) if target is not None else None

        async def single_round(tag: str, count: int, measured: Measured) -> None:
            limit = asyncio.Semaphore(spec.concurrency)
            keys = [f"raw-put-{tag}-{i:05d}" for i in range(count)]

            async def put(key: str) -> None:
                async with limit:
                    started = time.perf_counter()
                    await storage.put(key, put_body)
                    measured.latency.record(time.perf_counter() - started)

            try:
                await _timed(measured, spec.put_bytes * count, count, *(put(key) for key in keys))
            finally:
                await storage.delete(keys)

        async def multipart_round(tag: str, count: int, measured: Measured) -> None:
            assert client is not None
            assert target is not None
            limit = asyncio.Semaphore(spec.concurrency)
            keys = [f"{prefix}raw-mpu-{tag}-{i:05d}" for i in range(count)]
            starts = range(0, spec.object_bytes, spec.part_bytes)
            parts = [object_body[start : start + spec.part_bytes] for start in starts]

            async def upload(key: str) -> None:
                async with limit:
                    started = time.perf_counter()
                    created = await client.create_multipart_upload(Bucket=target.bucket, Key=key)
                    upload_id = created["UploadId"]

                    async def part(number: int, body: bytes) -> dict[str, Any]:
                        sent = await client.upload_part(
                            Bucket=target.bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=body
                        )
                        return {"PartNumber": number, "ETag": sent["ETag"]}

                    done = await asyncio.gather(*(part(n, body) for n, body in enumerate(parts, start=1)))
                    await client.complete_multipart_upload(
                        Bucket=target.bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": done}
                    )
                    measured.latency.record(time.perf_counter() - started)

            try:
                await _timed(measured, spec.object_bytes * count, count, *(upload(key) for key in keys))
            finally:
                for start in range(0, len(keys), 1000):
                    await client.delete_objects(
                        Bucket=target.bucket,
                        Delete={
                            "Objects": [{"Key": key} for key in keys[start : start + 1000]],
                            "Quiet": True,
                        },
                    )

        async def one(shape: str, tag: str, *, warmup: bool) -> Measured:
            measured = Measured(name=f"raw {shape}")
            if shape == shapes[0]:
                count = spec.concurrency if warmup else max(1, spec.total_bytes // spec.put_bytes)
                await single_round(tag, count, measured)
            else:
                count = spec.concurrency if warmup else max(1, spec.total_bytes // spec.object_bytes)
                await multipart_round(tag, count, measured)
            return measured

        for shape in shapes:
            await one(shape, "warm", warmup=True)
        for round_index in range(spec.rounds):
            for shape in shapes if round_index % 2 == 0 else shapes[::-1]:
                measured = await one(shape, f"r{round_index}", warmup=False)
                rates[shape].append(measured.mb_per_s)
                if measured.mb_per_s > best_rate:
                    best, best_rate = measured, measured.mb_per_s
    best.notes.extend(
        f"{shape}: {', '.join(f'{rate:.0f}' for rate in rates[shape])} MB/s" for shape in shapes
    )
    return best


async def _timed(measured: Measured, payload_bytes: int, op_count: int, *jobs: Any) -> None:
    """Run ``jobs`` together; their wall time, CPU and memory, payload and count go into ``measured``."""
    with ResourceMeter() as meter:
        started = time.perf_counter()
        await asyncio.gather(*jobs)
        measured.elapsed_s = time.perf_counter() - started
    measured.usage, measured.payload_bytes, measured.op_count = meter.usage, payload_bytes, op_count


async def delete_prefix(target: S3Target, prefix: str) -> int:
    """Delete every object under ``prefix`` (ListObjectsV2 pages, DeleteObjects batches); returns the count."""
    if not prefix or not prefix.endswith("/"):
        raise ValueError(f"refusing to delete under a prefix that is empty or not a directory: {prefix!r}")
    deleted = 0
    async with raw_s3_client(target) as client:
        paginator = client.get_paginator("list_objects_v2")
        async for page in paginator.paginate(Bucket=target.bucket, Prefix=prefix):
            keys = [item["Key"] for item in page.get("Contents", [])]
            if keys:
                await client.delete_objects(
                    Bucket=target.bucket, Delete={"Objects": [{"Key": key} for key in keys], "Quiet": True}
                )
                deleted += len(keys)
    return deleted


def _size_label(size_bytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size_bytes >= scale and size_bytes % scale == 0:
            return f"{size_bytes // scale} {unit}"
    return f"{size_bytes} B"


# --- durable writers: naive and SlateDB --------------------------------------------------------------


@dataclass(frozen=True)
class DurableWriteSpec:
    """Durable appends of small records, identical for every writer compared."""

    stream_count: int = 16
    record_bytes: int = 1024
    producer_count: int = 256
    """Appends in flight: each producer waits for its record to be durable before the next."""
    flush_interval_ms: int = 100
    """How often buffered records are made durable (SlateDB's ``flush_interval``; the naive writer's flush)."""
    warmup_s: float = 1.0
    duration_s: float = 5.0

    def __post_init__(self) -> None:
        if min(self.stream_count, self.record_bytes, self.producer_count, self.flush_interval_ms) <= 0:
            raise ValueError(f"every DurableWriteSpec count and size must be positive: {self}")
        if self.duration_s <= 0 or self.warmup_s < 0:
            raise ValueError(f"duration must be positive and warm-up non-negative: {self}")

    def label(self) -> str:
        return (
            f"{self.stream_count} streams, {_size_label(self.record_bytes)} records, "
            f"{self.producer_count} in flight, flush {self.flush_interval_ms} ms"
        )


class MeasureWindow:
    """Counts records and latencies only between the end of the warm-up and the deadline; every
    record (warm-up included) counts in ``result.written_bytes``, the base of requests per GiB."""

    def __init__(self, spec: DurableWriteSpec, result: Measured) -> None:
        now = time.perf_counter()
        self.measure_from = now + spec.warmup_s
        self.deadline = self.measure_from + spec.duration_s
        self.result = result
        self.record_bytes = spec.record_bytes

    def done(self) -> bool:
        return time.perf_counter() >= self.deadline

    def record(self, started: float, finished: float) -> None:
        self.result.written_bytes += self.record_bytes
        if self.measure_from <= started and finished <= self.deadline:
            self.result.latency.record(finished - started)
            self.result.op_count += 1
            self.result.payload_bytes += self.record_bytes


async def naive_writer(storage: ObjectStorage, spec: DurableWriteSpec) -> Measured:
    """Every ``flush_interval_ms`` PUT one object per stream holding that stream's buffered records;
    a record is durable when its stream's object is stored."""
    result = Measured(name=f"naive writer (one object per stream per flush; {spec.label()})")
    counter = RequestCounter()
    result.requests = counter
    payload = os.urandom(spec.record_bytes)
    pending: dict[int, list[tuple[bytes, asyncio.Future[None]]]] = {}
    window = MeasureWindow(spec, result)
    sequence = 0
    stop = asyncio.Event()

    async def flush_once() -> None:
        batches = list(pending.items())
        pending.clear()

        async def put_stream(stream: int, records: list[tuple[bytes, asyncio.Future[None]]]) -> None:
            nonlocal sequence
            sequence += 1
            body = b"".join(record for record, _ in records)
            try:
                await storage.put(f"naive/{stream:04d}/{sequence:012d}", body)
                counter.count("PutObject", written=len(body))
            except BaseException as exc:
                for _, future in records:
                    if not future.done():
                        future.set_exception(exc)
                raise
            for _, future in records:
                if not future.done():
                    future.set_result(None)

        await asyncio.gather(*(put_stream(stream, records) for stream, records in batches))

    async def flusher() -> None:
        interval_s = spec.flush_interval_ms / 1000
        while not (stop.is_set() and not pending):
            started = time.perf_counter()
            if pending:
                await flush_once()
            await asyncio.sleep(max(0.0, interval_s - (time.perf_counter() - started)))

    async def producer(index: int) -> None:
        loop = asyncio.get_running_loop()
        stream = index % spec.stream_count
        while not window.done():
            future: asyncio.Future[None] = loop.create_future()
            started = time.perf_counter()
            pending.setdefault(stream, []).append((payload, future))
            await future
            window.record(started, time.perf_counter())

    with ResourceMeter() as meter:
        flush_task = asyncio.create_task(flusher())
        try:
            await asyncio.gather(*(producer(i) for i in range(spec.producer_count)))
        finally:
            stop.set()
            await flush_task
    result.usage = meter.usage
    result.elapsed_s = spec.duration_s
    return result


_SLATEDB_API_CLASS = {
    "put": "PUT",
    "get": "GET",
    "head": "HEAD",
    "list": "LIST",
    "delete": "DELETE",
    "copy": "COPY",
}


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Any:
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


async def slatedb_writer(
    spec: DurableWriteSpec,
    *,
    target: S3Target | None,
    prefix: str,
    local_dir: Path | None = None,
) -> Measured:
    """The same durable writes through SlateDB: ``put`` then ``await_durable`` per record, its WAL
    flushed every ``flush_interval_ms``, on ``target`` under ``prefix`` (or in ``local_dir`` when
    ``target`` is None). S3 requests come from SlateDB's own object-store metrics."""
    from slatedb.uniffi import DbBuilder, DefaultMetricsRecorder, ObjectStore, Settings

    result = Measured(name=f"SlateDB put + await_durable ({spec.label()})")
    if target is not None:
        # SlateDB (Rust object_store) reads its S3 settings from the environment.
        env = {
            "AWS_ENDPOINT": target.endpoint,
            "AWS_ACCESS_KEY_ID": target.access_key,
            "AWS_SECRET_ACCESS_KEY": target.secret_key,
            "AWS_REGION": target.region,
            "AWS_ALLOW_HTTP": "true" if target.endpoint.startswith("http://") else "false",
            "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false",
        }
        with _environment(env):
            store = ObjectStore.resolve(f"s3://{target.bucket}")
        db_path = f"{prefix.strip('/')}/slatedb"
    else:
        if local_dir is None:
            raise ValueError("slatedb_writer needs local_dir when target is None")
        local_dir = await asyncio.to_thread(_make_dir, local_dir)
        store = ObjectStore.resolve("file:///")
        db_path = str(local_dir).lstrip("/")
    settings = Settings.default()
    settings.set("flush_interval", f'"{spec.flush_interval_ms}ms"')
    builder = DbBuilder(db_path, store)
    builder.with_settings(settings)
    recorder = DefaultMetricsRecorder()
    builder.with_metrics_recorder(recorder)
    db = await asyncio.wait_for(builder.build(), SLATEDB_STEP_TIMEOUT_S)
    payload = os.urandom(spec.record_bytes)
    window = MeasureWindow(spec, result)
    requests_before = _slatedb_requests(recorder)

    async def producer(index: int) -> None:
        stream = index % spec.stream_count
        sequence = 0
        while not window.done():
            sequence += 1
            started = time.perf_counter()
            handle = await db.put(b"%04d/%06d/%012d" % (stream, index, sequence), payload)
            await handle.await_durable()
            window.record(started, time.perf_counter())

    try:
        with ResourceMeter() as meter:
            await asyncio.wait_for(
                asyncio.gather(*(producer(i) for i in range(spec.producer_count))),
                spec.warmup_s + spec.duration_s + SLATEDB_STEP_TIMEOUT_S,
            )
    finally:
        await asyncio.wait_for(db.shutdown(), SLATEDB_STEP_TIMEOUT_S)
    result.usage = meter.usage
    result.elapsed_s = spec.duration_s
    counter = RequestCounter()
    for operation, count in (_slatedb_requests(recorder) - requests_before).items():
        for _ in range(count):
            counter.count(operation)
    result.requests = counter
    if target is None:
        result.notes.append("SlateDB ran on its local filesystem object store (target local)")
    return result


def _make_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path.absolute()


def _slatedb_requests(recorder: Any) -> Any:
    """SlateDB's object-store request counters as a Counter of S3 operation names."""
    from collections import Counter

    counts: Counter[str] = Counter()
    for metric in recorder.snapshot():
        if metric.name != "slatedb.object_store.request_count":
            continue
        labels = {label.key: label.value for label in metric.labels}
        value = metric.value[0] if metric.value.is_counter() else 0
        operation = {
            "PUT": "PutObject",
            "GET": "GetObject",
            "HEAD": "HeadObject",
            "LIST": "ListObjectsV2",
            "DELETE": "DeleteObject",
            "COPY": "CopyObject",
        }.get(_SLATEDB_API_CLASS.get(labels.get("api", ""), ""), "Other")
        counts[operation] += int(value)
    return counts


def requests_per_gib(measured: Measured) -> dict[str, float]:
    """S3 requests by class per GiB of ``measured``'s payload (empty without a counter)."""
    if measured.requests is None:
        return {}
    return {
        name: per_gib(count, measured.request_base_bytes)
        for name, count in measured.requests.snapshot()["by_class"].items()
        if count
    }
