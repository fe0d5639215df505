"""What turning metrics on costs the append path: the same appends with metrics on and off, same run.

Each round opens a fresh client (its own data dir and object prefix) and appends ``total`` bytes of
1 KiB record batches from 128 producers into 100 streams with uploads held back (the WAL and the
LogCache hold the whole run, as in the ``ingest`` workload's held-back row), so the figure is the
append path's own: WAL write, offsets, LogCache, acknowledgement, and with metrics on the timing
wrapper and its histogram. Rounds alternate off/on (off first in even rounds, on first in odd ones);
each side's figure is its median. While a metrics-on round runs, a thread scrapes its endpoint every
``scrape_s`` seconds (default 1 s; Prometheus' default is 15 s), so the exporter's work is in it.

Results: append MB/s with metrics on against off (goal: on >= 0.97 x off), the process CPU
seconds per GiB appended, on against off, and the event-loop CPU per append through an in-memory WAL
and object store (no disk: the steadiest figure on a shared machine), on against off. ``--param rounds=N`` (default 3 quick, 6 full),
``--param total_mib=N``, ``--param scrape_s=S``, ``--param uploads=1`` (default thresholds: uploads
run during the appends, so the S3 request metering is in the figure too).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import threading
import time
import urllib.request
from typing import Any

from benchmarks.core import Context, Result
from s3stream import RecordBatch
from s3stream.assembly import open_client
from s3stream.config import Config
from s3stream.engine.walport import MemoryWal
from s3stream.storage.memory import MemoryObjectStorage

W = "metrics"
KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
RECORD_BYTES = 1 * KiB
STREAMS = 100
PRODUCERS = 128


def _config(ctx: Context, *, metrics: bool, total_bytes: int, uploads: bool) -> Config:
    fields: dict[str, Any] = {"wal_aio": ctx.param("wal_aio", Config().wal_aio)}
    if not uploads:
        room = max(256 * MiB, 2 * total_bytes)
        fields.update(
            wal_capacity_bytes=room,
            wal_cache_size_bytes=room,
            wal_upload_threshold_bytes=room,
            wal_upload_interval_ms=86_400_000,
        )
    if metrics:
        fields["metrics_exporter_uri"] = "prometheus://?host=127.0.0.1&port=0"
    return Config(**fields)


class _Scraper:
    """Scrapes an endpoint every ``interval_s`` on a thread until stopped; counts the scrapes."""

    def __init__(self, url: str, interval_s: float) -> None:
        self.url = url
        self.interval_s = interval_s
        self.count = 0
        self.bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-scraper", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            with urllib.request.urlopen(self.url, timeout=10) as response:
                self.bytes += len(response.read())
            self.count += 1

    def __enter__(self) -> _Scraper:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


async def _round(
    ctx: Context, *, metrics: bool, index: int, total_bytes: int, uploads: bool
) -> dict[str, float]:
    name = f"{'on' if metrics else 'off'}-{index}"
    config = _config(ctx, metrics=metrics, total_bytes=total_bytes, uploads=uploads)
    bucket_uri = ctx.s3.uri(ctx.key_prefix(name)) if ctx.s3 is not None else None
    client = await open_client(ctx.scratch(name), bucket_uri=bucket_uri, config=config)
    try:
        streams = [await client.streams.create_and_open_stream() for _ in range(STREAMS)]
        appends = total_bytes // RECORD_BYTES
        payload = os.urandom(RECORD_BYTES)

        async def producer(first: int) -> None:
            for n in range(first, appends, PRODUCERS):
                await streams[n % STREAMS].append(RecordBatch(payload))

        endpoint = client.metrics_endpoint
        scrape_s = float(ctx.param("scrape_s", 1.0))
        scraper = _Scraper(endpoint, scrape_s) if endpoint is not None else None
        cpu0, started = time.process_time(), time.perf_counter()
        if scraper is not None:
            with scraper:
                await asyncio.gather(*(producer(i) for i in range(PRODUCERS)))
        else:
            await asyncio.gather(*(producer(i) for i in range(PRODUCERS)))
        elapsed_s = time.perf_counter() - started
        cpu_s = time.process_time() - cpu0
        await client.engine.force_upload(None)
        return {
            "mb_s": appends * RECORD_BYTES / 1e6 / elapsed_s,
            "cpu_s_per_gib": cpu_s / (appends * RECORD_BYTES / GiB),
            "scrapes": float(scraper.count if scraper is not None else 0),
        }
    finally:
        await client.close()


async def _loop_cpu_round(*, metrics: bool, appends: int, scratch: Any) -> float:
    """Event-loop thread CPU (us) per 1 KiB append through an in-memory WAL and object store: the
    append path's own cost without the disk, whose time varies far more than the difference."""
    room = 1 << 30
    config = Config(
        wal_capacity_bytes=room,
        wal_cache_size_bytes=room,
        wal_upload_threshold_bytes=room,
        wal_upload_interval_ms=86_400_000,
        metrics_exporter_uri="prometheus://?host=127.0.0.1&port=0" if metrics else "",
    )
    client = await open_client(
        scratch, config=config, wal=MemoryWal(capacity_bytes=room), storage=MemoryObjectStorage()
    )
    try:
        streams = [await client.streams.create_and_open_stream() for _ in range(STREAMS)]
        payload = os.urandom(RECORD_BYTES)

        async def producer(first: int) -> None:
            for n in range(first, appends, PRODUCERS):
                await streams[n % STREAMS].append(RecordBatch(payload))

        cpu0 = time.thread_time()
        await asyncio.gather(*(producer(i) for i in range(PRODUCERS)))
        return (time.thread_time() - cpu0) / appends * 1e6
    finally:
        await client.close()


async def run(ctx: Context) -> list[Result]:
    rounds = int(ctx.param("rounds", ctx.scale(quick=3, full=6)))
    total_bytes = int(ctx.param("total_mib", ctx.scale(quick=16, full=64))) * MiB
    uploads = bool(int(ctx.param("uploads", 0)))
    runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    for index in range(rounds):
        order = (False, True) if index % 2 == 0 else (True, False)
        for metrics in order:
            ctx.status(f"metrics: round {index + 1}/{rounds}, metrics {'on' if metrics else 'off'}")
            runs[metrics].append(
                await _round(ctx, metrics=metrics, index=index, total_bytes=total_bytes, uploads=uploads)
            )
    on_mb_s = [r["mb_s"] for r in runs[True]]
    off_mb_s = [r["mb_s"] for r in runs[False]]
    on_cpu = [r["cpu_s_per_gib"] for r in runs[True]]
    off_cpu = [r["cpu_s_per_gib"] for r in runs[False]]
    extra = {
        "rounds": rounds,
        "total_bytes": total_bytes,
        "record_bytes": RECORD_BYTES,
        "uploads_during_appends": uploads,
        "on_mb_s_rounds": on_mb_s,
        "off_mb_s_rounds": off_mb_s,
        "ratio_rounds": [a / b if b else 0.0 for a, b in zip(on_mb_s, off_mb_s, strict=True)],
        "on_cpu_s_per_gib_rounds": on_cpu,
        "off_cpu_s_per_gib_rounds": off_cpu,
        "scrapes_per_on_round": [r["scrapes"] for r in runs[True]],
    }
    cpu_appends = int(ctx.param("cpu_appends", ctx.scale(quick=50_000, full=200_000)))
    loop_us: dict[bool, list[float]] = {False: [], True: []}
    for index in range(rounds):
        for metrics in (False, True) if index % 2 == 0 else (True, False):
            ctx.status(f"metrics: loop CPU round {index + 1}/{rounds}, metrics {'on' if metrics else 'off'}")
            scratch = ctx.scratch(f"cpu-{'on' if metrics else 'off'}-{index}")
            loop_us[metrics].append(
                await _loop_cpu_round(metrics=metrics, appends=cpu_appends, scratch=scratch)
            )
    label = "uploads running" if uploads else "uploads held back"
    return [
        Result(
            W,
            f"1 KiB append MB/s with metrics on ({label})",
            statistics.median(on_mb_s),
            "MB/s",
            "the same appends with metrics off (alternating rounds, medians)",
            statistics.median(off_mb_s),
            True,
            extra,
        ),
        Result(
            W,
            f"process CPU s per GiB appended with metrics on ({label})",
            statistics.median(on_cpu),
            "s",
            "metrics off (same rounds)",
            statistics.median(off_cpu),
            False,
            {"rounds": rounds},
        ),
        Result(
            W,
            "event-loop CPU us per 1 KiB append with metrics on (in-memory WAL and objects)",
            statistics.median(loop_us[True]),
            "us",
            "metrics off (alternating rounds, medians)",
            statistics.median(loop_us[False]),
            False,
            {
                "rounds": rounds,
                "appends": cpu_appends,
                "on_us_rounds": loop_us[True],
                "off_us_rounds": loop_us[False],
            },
        ),
    ]
