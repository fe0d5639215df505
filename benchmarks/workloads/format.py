"""Workload ``format``: object encode and decode throughput vs a plain memory copy of the same bytes.

For record payloads of 1 KiB, 16 KiB and 256 KiB (4 streams, default 1 MiB blocks, ``object_mib``
of payload per object):

- **encode**: ``ObjectWriter.write`` + ``close`` into an in-process upload that keeps the parts it
  is handed (no storage copy): record and block headers, block cutting, CRC32C of every block,
  index, checksum section, footer.
- **decode**: ``ObjectReader.open`` (tail read, footer, checksum section, index, all verified) and
  ``read_blocks`` of every block (one ranged read of the data blocks, CRC32C check of each block,
  decoding into StreamRecordBatch values with copied payloads), from an in-memory source whose
  ranges are sliced before timing (the bytes as they arrive from storage).
- **baseline**: one plain copy of the encoded object's bytes (a memcpy into an allocated, already
  touched buffer of the same size: the machine's copy bandwidth, no page faults).
- **ceiling**: CRC32C of the object's bytes with the ``crc32c`` library (the checksum the format
  computes on encode and verifies on decode). An encoder writes every byte once and checksums it
  once, and a decoder that hands out copied payloads does the same, so neither can beat
  ``copy time + CRC time``: ``ceiling = 1 / (1 + copy MB/s / CRC MB/s)`` of the memory copy, given
  in each result's ``ceiling`` extra and beside its goal row. Where CRC32C runs slower than a copy
  (the ``crc32`` instruction retires 8 bytes per few cycles on many x86 cores), that is below 0.5.

Figures are MB/s of object bytes (10^6 bytes per second); best of ``rounds`` rounds each;
ratio = format / memory copy (goal >= 0.5). CPU s/GiB (of object bytes) of each side sums this
process's CPU over every round of that side. The extras also give a copy into newly allocated memory
(``bytearray(object)``: what any encoder or decoder producing new bytes pays in page faults) and
the copy done the way Python code copies records (one slice assignment per record), to separate
allocation and per-record interpreter costs from the format's own work.
"""

from __future__ import annotations

import time
from typing import Any

from crc32c import crc32c

from benchmarks.core import Context, Result
from benchmarks.measure import ResourceMeter, per_gib
from s3stream.objectformat import ObjectReader, ObjectWriter
from s3stream.record import StreamRecordBatch

MiB = 1 << 20
KiB = 1 << 10
STREAM_COUNT = 4


class _KeepParts:
    """An Upload that keeps what it is handed: encode cost without any storage copy."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.parts: list[bytes | bytearray | memoryview] = []

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        self.parts.append(data)

    async def copy(self, source_key: str, start: int, end: int) -> None:  # pragma: no cover - unused
        raise NotImplementedError

    async def complete(self) -> int:
        return sum(len(p) for p in self.parts)

    async def abort(self) -> None:
        self.parts.clear()


class _BytesSource:
    """Ranged reads of one in-memory object. Each range is sliced once and then handed out again, so
    timed reads measure the format's work, not the copy a storage makes when bytes arrive."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self._slices: dict[tuple[int, int], bytes] = {}

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        stop = len(self.data) if end is None else end
        if (start, stop) not in self._slices:
            self._slices[start, stop] = self.data[start:stop]
        return self._slices[start, stop]


def _records(payload_bytes: int, total_bytes: int) -> list[StreamRecordBatch]:
    per_stream = max(1, total_bytes // payload_bytes // STREAM_COUNT)
    payload = bytes(range(256)) * (payload_bytes // 256) + bytes(payload_bytes % 256)
    return [
        StreamRecordBatch(stream_id, 3, offset * 10, 10, payload)
        for stream_id in range(STREAM_COUNT)
        for offset in range(per_stream)
    ]


async def _encode(records: list[StreamRecordBatch]) -> tuple[float, _KeepParts, int]:
    """Time one encode; the parts are joined by the caller, outside the metered section."""
    upload = _KeepParts("bench")
    start = time.perf_counter()
    writer = ObjectWriter(upload)
    await writer.write(records)
    written = await writer.close()
    return time.perf_counter() - start, upload, written.size_bytes


def _joined(upload: _KeepParts, size_bytes: int) -> bytes:
    data = b"".join(upload.parts)
    assert len(data) == size_bytes
    return data


async def _decode(source: _BytesSource, record_count: int) -> float:
    data = source.data
    start = time.perf_counter()
    reader = await ObjectReader.open(source, "bench", len(data))
    blocks = await reader.read_blocks(reader.index)
    elapsed = time.perf_counter() - start
    assert sum(len(b.records) for b in blocks) == record_count
    return elapsed


def _memcpy(data: bytes, dst: bytearray) -> float:
    """One memcpy of the object into a buffer that is already allocated and touched (no page faults)."""
    start = time.perf_counter()
    memoryview(dst)[:] = data
    elapsed = time.perf_counter() - start
    assert len(dst) == len(data)
    return elapsed


def _fresh_copy(data: bytes) -> float:
    """A copy into newly allocated memory (``bytearray(object)``: allocation, page faults, memcpy)."""
    start = time.perf_counter()
    copy = bytearray(data)
    elapsed = time.perf_counter() - start
    del copy
    return elapsed


def _crc(data: bytes) -> float:
    """CRC32C of the whole object, as the format checksums its blocks (the library the format uses)."""
    start = time.perf_counter()
    crc32c(data)
    return time.perf_counter() - start


def _per_record_copy(records: list[StreamRecordBatch], size: int) -> float:
    buf = bytearray(size)
    start = time.perf_counter()
    pos = 0
    for r in records:
        end = pos + len(r.payload)
        buf[pos:end] = r.payload
        pos = end
    return time.perf_counter() - start


async def run(ctx: Context) -> list[Result]:
    total_bytes = (8 if ctx.quick else 64) * MiB
    rounds = 3 if ctx.quick else 7
    results: list[Result] = []
    for payload_bytes in (1 * KiB, 16 * KiB, 256 * KiB):
        records = _records(payload_bytes, total_bytes)
        encode_s = decode_s = copy_s = fresh_s = loop_s = crc_s = float("inf")
        _, upload, size = await _encode(records)
        data = _joined(upload, size)
        source = _BytesSource(data)
        await _decode(source, len(records))  # warm-up: the source slices its ranges once
        dst = bytearray(len(data))  # the baseline's destination, touched once before timing
        cpu_s = {"encode": 0.0, "decode": 0.0, "copy": 0.0}
        for _ in range(rounds):
            with ResourceMeter(interval_s=0) as meter:
                elapsed, upload, size = await _encode(records)
            cpu_s["encode"] += meter.usage.cpu_s
            data = _joined(upload, size)
            del upload
            encode_s = min(encode_s, elapsed)
            with ResourceMeter(interval_s=0) as meter:
                decoded_s = await _decode(source, len(records))
            cpu_s["decode"] += meter.usage.cpu_s
            decode_s = min(decode_s, decoded_s)
            with ResourceMeter(interval_s=0) as meter:
                copied_s = _memcpy(data, dst)
            cpu_s["copy"] += meter.usage.cpu_s
            copy_s = min(copy_s, copied_s)
            fresh_s = min(fresh_s, _fresh_copy(data))
            loop_s = min(loop_s, _per_record_copy(records, len(data)))
            crc_s = min(crc_s, _crc(data))
        mb = len(data) / 1e6
        ceiling = 1.0 / (1.0 + crc_s / copy_s)
        extra: dict[str, Any] = {
            "payload_bytes": payload_bytes,
            "object_bytes": len(data),
            "records": len(records),
            "rounds": rounds,
            "per_record_copy_mb_s": mb / loop_s,
            "fresh_memory_copy_mb_s": mb / fresh_s,
            "crc32c_mb_s": mb / crc_s,
            "ceiling": {
                "ratio": ceiling,
                "why": f"one copy + CRC32C at {mb / crc_s:,.0f} MB/s (copy {mb / copy_s:,.0f} MB/s)",
            },
        }
        for metric, seconds in (("encode", encode_s), ("decode", decode_s)):
            results.append(
                Result(
                    workload="format",
                    metric=f"{metric}_mb_s_{payload_bytes // KiB}k",
                    value=mb / seconds,
                    unit="MB/s",
                    baseline="memory copy of the object bytes",
                    baseline_value=mb / copy_s,
                    extra=dict(extra, per_record_copy_ratio=(mb / seconds) / (mb / loop_s)),
                    cpu_s_per_gib=per_gib(cpu_s[metric], rounds * len(data)),
                    baseline_cpu_s_per_gib=per_gib(cpu_s["copy"], rounds * len(data)),
                )
            )
    return results
