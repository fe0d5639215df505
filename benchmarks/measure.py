"""Measurement helpers every workload shares: latency percentiles, CPU and peak memory, S3 request counts.

- :class:`LatencyRecorder`: record durations (seconds), read p50 / p99 / p999 in milliseconds.
- :class:`ResourceMeter`: CPU seconds and peak RSS of this process (and its children) over a block.
- :class:`RequestCounter`: S3 requests by class (PUT / GET / COPY / DELETE / LIST / HEAD) and per GiB.
  Fed either by :class:`CountingStorage` (wraps any ``ObjectStorage``: counts calls of the engine's
  protocol) or by a botocore event hook (:meth:`RequestCounter.attach` on one aiobotocore client,
  :meth:`RequestCounter.count_aiobotocore` on every client created while active: raw HTTP requests,
  retries included).
- :func:`throughput` / :func:`per_gib` / :func:`cpu_per_gib`: the unit conversions every table uses.

Result extras use these key conventions so the report can plot them: ``latency_ms`` and
``baseline_latency_ms`` (dicts from :meth:`LatencyRecorder.summary_ms`), ``cpu_s``,
``peak_rss_bytes``, ``s3_requests_per_gib`` (dict by class).
"""

from __future__ import annotations

import contextlib
import math
import os
import resource
import threading
import time
from array import array
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from s3stream.storage.base import ObjectInfo, ObjectStorage, Upload

MIB = 1024 * 1024
GIB = 1024 * MIB


def throughput(amount: float, seconds: float) -> float:
    """``amount`` per second; 0 when no time passed (never a division error in a report)."""
    return amount / seconds if seconds > 0 else 0.0


def per_gib(count: float, payload_bytes: int) -> float:
    """``count`` scaled to one GiB of payload."""
    return count * GIB / payload_bytes if payload_bytes > 0 else float("nan")


def cpu_per_gib(usage: ResourceUsage, payload_bytes: int) -> float:
    """CPU seconds of a :class:`ResourceMeter` section per GiB of ``payload_bytes`` moved in it (the
    ``cpu_s_per_gib`` of a :class:`benchmarks.core.Result`); NaN when nothing moved."""
    return per_gib(usage.cpu_s, payload_bytes)


# --- latency ---------------------------------------------------------------------------------------


class LatencyRecorder:
    """Durations in seconds; percentiles by nearest rank over every sample (bounded by ``samples_max``).

    Past ``samples_max`` it keeps a uniform reservoir sample, so memory stays bounded on long runs.
    """

    def __init__(self, samples_max: int = 1_000_000, seed: int = 0) -> None:
        assert samples_max > 0
        self._samples = array("d")
        """Raw doubles, not a list of float objects: a full garbage collection during a paced run
        would walk every sample of a list (400,000 a run: ~1.4 ms of each collection's pause)."""
        self._seen_count = 0
        self._samples_max = samples_max
        self._rng_state = seed or 0x9E3779B9
        self.total_s = 0.0
        self.max_s = 0.0

    def record(self, seconds: float) -> None:
        self._seen_count += 1
        self.total_s += seconds
        self.max_s = max(self.max_s, seconds)
        if len(self._samples) < self._samples_max:
            self._samples.append(seconds)
            return
        # xorshift reservoir sampling: replace a random slot with probability samples_max / seen.
        x = self._rng_state
        x ^= (x << 13) & 0xFFFFFFFF
        x ^= x >> 17
        x ^= (x << 5) & 0xFFFFFFFF
        self._rng_state = x
        slot = x % self._seen_count
        if slot < self._samples_max:
            self._samples[slot] = seconds

    def extend(self, seconds: Sequence[float]) -> None:
        for value in seconds:
            self.record(value)

    @contextlib.contextmanager
    def time(self) -> Iterator[None]:
        """Record how long the ``with`` block took."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.record(time.perf_counter() - started)

    @property
    def count(self) -> int:
        return self._seen_count

    def percentile_s(self, fraction: float) -> float:
        """Nearest-rank percentile, ``fraction`` in (0, 1]; NaN when empty."""
        assert 0 < fraction <= 1
        if not self._samples:
            return float("nan")
        ordered = sorted(self._samples)
        rank = max(1, math.ceil(fraction * len(ordered)))
        return ordered[rank - 1]

    def summary_ms(self) -> dict[str, float]:
        """count, mean, p50, p99, p999 and max in milliseconds (the ``latency_ms`` extra)."""
        if not self._samples:
            return {"count": 0}
        ordered = sorted(self._samples)

        def rank(fraction: float) -> float:
            return ordered[max(1, math.ceil(fraction * len(ordered))) - 1] * 1000

        return {
            "count": self._seen_count,
            "mean": self.total_s / self._seen_count * 1000,
            "p50": rank(0.50),
            "p99": rank(0.99),
            "p999": rank(0.999),
            "max": self.max_s * 1000,
        }


# --- CPU and memory --------------------------------------------------------------------------------


@dataclass
class ResourceUsage:
    wall_s: float = 0.0
    cpu_s: float = 0.0
    """User + system CPU seconds of this process (all threads, native ones included) and its children."""
    peak_rss_bytes: int = 0
    """Largest resident set seen while sampling (this process plus live children)."""

    @property
    def cpu_util(self) -> float:
        """CPU seconds per wall second (2.0 = both cores of this machine busy)."""
        return throughput(self.cpu_s, self.wall_s)

    def to_extra(self) -> dict[str, float]:
        return {
            "wall_s": self.wall_s,
            "cpu_s": self.cpu_s,
            "cpu_util": self.cpu_util,
            "peak_rss_bytes": float(self.peak_rss_bytes),
        }


def _own_cpu_s() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime


def _reaped_children_cpu_s() -> float:
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return children.ru_utime + children.ru_stime


_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _sample_process_tree(live_children_cpu_s: dict[int, float]) -> int:
    """RSS of this process and its live children; records each live child's CPU seconds so far.

    Reads /proc directly: only this process's threads' children files and each descendant's statm
    and stat (~0.1 ms a sample). psutil's ``children(recursive=True)`` reads every process's stat
    to find them, ~1.3 ms of CPU a sample, 20 times a second in the process being measured, partly
    holding the GIL its event loop needs; it is the fallback where /proc has no children files."""
    try:
        total = _proc_rss_bytes("self")
        pending = _proc_child_pids("self")
    except OSError:
        return _sample_process_tree_psutil(live_children_cpu_s)
    while pending:
        pid = pending.pop()
        with contextlib.suppress(OSError, ValueError, IndexError):  # the child exited meanwhile
            total += _proc_rss_bytes(str(pid))
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            live_children_cpu_s[pid] = (int(stat[11]) + int(stat[12])) / _CLOCK_TICKS  # utime, stime
            pending.extend(_proc_child_pids(str(pid)))
    return total


def _proc_rss_bytes(pid: str) -> int:
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * _PAGE_BYTES


def _proc_child_pids(pid: str) -> list[int]:
    """Direct children of every thread of ``pid`` (/proc/<pid>/task/<tid>/children)."""
    tasks = Path(f"/proc/{pid}/task")
    return [int(child) for task in tasks.iterdir() for child in (task / "children").read_text().split()]


def _sample_process_tree_psutil(live_children_cpu_s: dict[int, float]) -> int:
    try:
        import psutil
    except ImportError:  # the bench extra is missing: fall back to the lifetime peak
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    process = psutil.Process()
    total = int(process.memory_info().rss)
    for child in process.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            total += int(child.memory_info().rss)
            times = child.cpu_times()
            live_children_cpu_s[child.pid] = float(times.user + times.system)
    return total


class ResourceMeter:
    """CPU time and peak RSS over a ``with`` block, sampled by a daemon thread every ``interval_s``.

    CPU is this process's (all threads, native ones included) plus its children's: the larger of what
    the children reaped during the block used (getrusage) and what the live children sampled used
    (psutil; a JVM that outlives the block is only seen this way). Peak RSS sums the process tree.

    >>> with ResourceMeter() as meter:
    ...     work()
    >>> meter.usage.cpu_s, meter.usage.peak_rss_bytes
    """

    def __init__(self, interval_s: float = 0.05) -> None:
        """``interval_s`` 0: no sampling thread and no peak RSS (CPU of this process and of the
        children reaped in the block only): for sections of milliseconds run in this process, where
        starting a thread would cost more than the section's own work."""
        self.usage = ResourceUsage()
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started_wall = 0.0
        self._started_own_cpu = 0.0
        self._started_reaped_cpu = 0.0
        self._children_cpu_at_start: dict[int, float] = {}
        self._children_cpu_seen: dict[int, float] = {}

    def _sample(self) -> None:
        while not self._stop.wait(self._interval_s):
            rss = _sample_process_tree(self._children_cpu_seen)
            self.usage.peak_rss_bytes = max(self.usage.peak_rss_bytes, rss)

    def __enter__(self) -> ResourceMeter:
        self._started_wall = time.perf_counter()
        self._started_own_cpu = _own_cpu_s()
        self._started_reaped_cpu = _reaped_children_cpu_s()
        if not self._interval_s:
            return self
        self.usage.peak_rss_bytes = _sample_process_tree(self._children_cpu_at_start)
        self._children_cpu_seen.update(self._children_cpu_at_start)
        self._thread = threading.Thread(target=self._sample, name="resource-meter", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._interval_s:
            rss = _sample_process_tree(self._children_cpu_seen)
            self.usage.peak_rss_bytes = max(self.usage.peak_rss_bytes, rss)
        self.usage.wall_s = time.perf_counter() - self._started_wall
        reaped_cpu_s = _reaped_children_cpu_s() - self._started_reaped_cpu
        sampled_cpu_s = sum(
            cpu_s - self._children_cpu_at_start.get(pid, 0.0)
            for pid, cpu_s in self._children_cpu_seen.items()
        )
        self.usage.cpu_s = _own_cpu_s() - self._started_own_cpu + max(reaped_cpu_s, sampled_cpu_s)


# --- S3 requests -----------------------------------------------------------------------------------

REQUEST_CLASSES = ("PUT", "GET", "COPY", "DELETE", "LIST", "HEAD")

_OPERATION_CLASS = {
    "PutObject": "PUT",
    "CreateMultipartUpload": "PUT",
    "UploadPart": "PUT",
    "CompleteMultipartUpload": "PUT",
    "AbortMultipartUpload": "PUT",
    "CreateBucket": "PUT",
    "UploadPartCopy": "COPY",
    "CopyObject": "COPY",
    "GetObject": "GET",
    "HeadObject": "HEAD",
    "HeadBucket": "HEAD",
    "DeleteObject": "DELETE",
    "DeleteObjects": "DELETE",
    "ListObjects": "LIST",
    "ListObjectsV2": "LIST",
    "ListMultipartUploads": "LIST",
    "ListParts": "LIST",
    "ListBuckets": "LIST",
}


def request_class(operation: str) -> str:
    """The billing class of an S3 operation name (``PutObject`` -> ``PUT``); unknown ones are ``OTHER``."""
    return _OPERATION_CLASS.get(operation, "OTHER")


@dataclass
class RequestCounter:
    """S3 requests by class and by operation, plus payload bytes written and read."""

    by_class: Counter[str] = field(default_factory=Counter)
    by_operation: Counter[str] = field(default_factory=Counter)
    bytes_written: int = 0
    bytes_read: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count(self, operation: str, *, written: int = 0, read: int = 0) -> None:
        with self._lock:
            self.by_operation[operation] += 1
            self.by_class[request_class(operation)] += 1
            self.bytes_written += written
            self.bytes_read += read

    def reset(self) -> None:
        with self._lock:
            self.by_class.clear()
            self.by_operation.clear()
            self.bytes_written = self.bytes_read = 0

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "by_class": {name: self.by_class.get(name, 0) for name in (*REQUEST_CLASSES, "OTHER")},
                "by_operation": dict(self.by_operation),
                "bytes_written": self.bytes_written,
                "bytes_read": self.bytes_read,
            }

    def per_gib(self, payload_bytes: int) -> dict[str, float]:
        """Requests of each class per GiB of ``payload_bytes`` (the workload's logical bytes)."""
        with self._lock:
            return {name: per_gib(self.by_class.get(name, 0), payload_bytes) for name in REQUEST_CLASSES}

    # botocore hook: every HTTP attempt (retries included) of a client, by operation name.
    def _on_before_send(self, **kwargs: Any) -> None:
        event_name: str = kwargs.get("event_name", "")
        operation = event_name.rsplit(".", 1)[-1]
        request = kwargs.get("request")
        headers = getattr(request, "headers", None) or {}
        try:
            written = (
                int(headers.get("Content-Length", 0) or 0) if operation in ("PutObject", "UploadPart") else 0
            )
        except (TypeError, ValueError):
            written = 0
        self.count(operation, written=written)

    def _on_after_call(self, **kwargs: Any) -> None:
        if not kwargs.get("event_name", "").endswith(".GetObject"):
            return
        parsed = kwargs.get("parsed") or {}
        with contextlib.suppress(TypeError, ValueError), self._lock:
            self.bytes_read += int(parsed.get("ContentLength", 0) or 0)

    def attach(self, client: Any) -> None:
        """Count every request an aiobotocore (or botocore) S3 client sends from now on (every HTTP
        attempt, retries included), the bytes PUT and the bytes of GetObject answers."""
        client.meta.events.register("before-send.s3", self._on_before_send)
        client.meta.events.register("after-call.s3.GetObject", self._on_after_call)

    def detach(self, client: Any) -> None:
        client.meta.events.unregister("before-send.s3", self._on_before_send)
        client.meta.events.unregister("after-call.s3.GetObject", self._on_after_call)

    @contextlib.contextmanager
    def count_aiobotocore(self) -> Iterator[RequestCounter]:
        """Attach to every aiobotocore client created inside the block (the engine's own clients too)."""
        from aiobotocore.session import AioSession

        original = AioSession._create_client
        counter = self

        async def create_and_attach(session: AioSession, *args: Any, **kwargs: Any) -> Any:
            client = await original(session, *args, **kwargs)
            if getattr(client.meta, "service_model", None) is not None and (
                client.meta.service_model.service_name == "s3"
            ):
                counter.attach(client)
            return client

        AioSession._create_client = create_and_attach
        try:
            yield self
        finally:
            AioSession._create_client = original


class _CountingUpload:
    def __init__(self, inner: Upload, counter: RequestCounter) -> None:
        self._inner = inner
        self._counter = counter
        self.key = inner.key
        self._written = 0

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        self._written += len(data)
        await self._inner.write(data)

    async def copy(self, source_key: str, start: int, end: int) -> None:
        self._counter.count("UploadPartCopy")
        await self._inner.copy(source_key, start, end)

    async def complete(self) -> int:
        size = await self._inner.complete()
        # One logical PUT; the raw botocore hook sees the multipart requests behind it.
        self._counter.count("PutObject", written=self._written)
        return size

    async def abort(self) -> None:
        await self._inner.abort()
        self._counter.count("AbortMultipartUpload")


class CountingStorage:
    """An ``ObjectStorage`` that counts the calls made through it (logical requests, not HTTP ones)."""

    def __init__(self, inner: ObjectStorage, counter: RequestCounter | None = None) -> None:
        self.inner = inner
        self.counter = counter if counter is not None else RequestCounter()

    async def put(self, key: str, data: bytes | bytearray | memoryview, *, if_absent: bool = False) -> None:
        await self.inner.put(key, data, if_absent=if_absent)
        self.counter.count("PutObject", written=len(data))

    def upload(self, key: str, *, buffer_max_bytes: int | None = None) -> Upload:
        return _CountingUpload(self.inner.upload(key, buffer_max_bytes=buffer_max_bytes), self.counter)

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        data = await self.inner.get(key, start, end)
        self.counter.count("GetObject", read=len(data))
        return data

    async def head(self, key: str) -> ObjectInfo:
        self.counter.count("HeadObject")
        return await self.inner.head(key)

    async def delete(self, keys: Sequence[str]) -> None:
        self.counter.count("DeleteObjects")
        await self.inner.delete(keys)

    async def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        self.counter.count("ListObjectsV2")
        async for info in self.inner.list(prefix):
            yield info

    async def close(self) -> None:
        await self.inner.close()
