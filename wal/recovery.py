"""The recovery scan: walk the log from the header's start offset and apply the recovery rule.

The rule (docs/format.md, section 4.6) in short. Starting at ``start_offset`` the scan follows the
chain of records: a data record at ``pos`` is valid when its header CRC, magic, version, ``wal_id`` and
``offset == pos`` hold and its body CRC matches; the next record starts right after it. Zero bytes from a
non-aligned position up to the next block boundary end a write group: the next group starts at that
boundary. A padding record moves the scan by its length. The first position that fails is the *end
candidate* E:

* a padding record at ``align_up(E)`` is a bridge written by an earlier recovery over a torn tail it
  cut off: the chain continues there;
* otherwise the log ends at E. At most ``inflight_groups`` (K, header) groups were in flight when a
  crash hit, all within ``window`` bytes past E, and the hole is in one of them: so at most K - 1
  valid data records flagged FIRST (group starts) can follow E there. K or more mean the log went on
  after the hole, which no crash explains: the scan raises :class:`WalCorruptionError` with E's
  position. Later groups inside the window are dropped (none was acknowledged: completions are in
  offset order);
* after a clean close the header names the end; a scan that stops elsewhere raises the same error.

Only whole, checksummed records are returned, so torn or stale bytes never come back as data.
"""

from __future__ import annotations

import contextlib
import mmap
from dataclasses import dataclass, field
from typing import NamedTuple

from crc32c import crc32c

from wal.device import Device, aligned_buffer
from wal.errors import WalCorruptionError
from wal.format import (
    DATA_MAGIC,
    FLAG_FIRST,
    NO_CLEAN_END,
    PAD_MAGIC,
    RECORD_HEADER_SIZE,
    RecordHeader,
    WalHeader,
    decode_record_header,
)

_READ_CHUNK_BYTES = 8 << 20
_BATCH_BYTES = 16 << 20


class WalRecord(NamedTuple):
    offset: int
    """The logical offset of the record (of its header): 64-bit, never reused."""
    data: bytes


def align_up(value: int, block: int) -> int:
    return -(-value // block) * block


@dataclass(frozen=True)
class Layout:
    """Where logical offsets live on the device: two header slots, then the circular record area."""

    block: int
    device_bytes: int

    @property
    def base(self) -> int:
        return 2 * self.block

    @property
    def area(self) -> int:
        return self.device_bytes - self.base

    def phys(self, offset: int) -> int:
        return self.base + offset % self.area


class _Reader:
    """Block-aligned chunked reads; views it returns are valid until the next call."""

    def __init__(self, device: Device, block: int) -> None:
        self.device = device
        self.block = block
        self.buf: mmap.mmap = aligned_buffer(_READ_CHUNK_BYTES)
        self.view = memoryview(self.buf)
        self.start = 0
        self.end = 0
        self.bytes_read = 0

    def get(self, pos: int, n: int) -> memoryview | None:
        if pos + n > self.device.size_bytes:
            return None
        if self.start <= pos and pos + n <= self.end:
            return self.view[pos - self.start : pos - self.start + n]
        first = pos - pos % self.block
        size = min(
            max(_READ_CHUNK_BYTES, align_up(pos + n, self.block) - first), self.device.size_bytes - first
        )
        if size > len(self.buf):
            self.view.release()
            self.buf.close()
            self.buf = aligned_buffer(size)
            self.view = memoryview(self.buf)
        got = self.device.read_into(first, self.view[:size])
        self.bytes_read += got
        self.start, self.end = first, first + got
        if pos + n > self.end:
            return None
        return self.view[pos - first : pos - first + n]

    def close(self) -> None:
        self.view.release()
        with contextlib.suppress(BufferError):  # a caller's frame may still hold a slice: GC frees it
            self.buf.close()


@dataclass
class ScanResult:
    end_offset: int
    """Where the chain stopped: the position of the first byte that is not part of the log."""
    group_starts: list[int] = field(default_factory=list)
    record_count: int = 0


class Scanner:
    """Recovers records batch by batch (each batch call does blocking reads: run it off the loop)."""

    def __init__(self, device: Device, layout: Layout, header: WalHeader) -> None:
        self.layout = layout
        self.header = header
        self.reader = _Reader(device, layout.block)
        self.pos = header.start_offset
        self.limit = header.start_offset + layout.area
        self.result: ScanResult | None = None
        self.group_starts: list[int] = []
        self.record_count = 0
        self._zeros = bytes(layout.block)

    @property
    def done(self) -> bool:
        return self.result is not None

    def next_batch(self) -> list[WalRecord]:
        """The next records in offset order (empty when done); sets ``result`` at the end of the log."""
        out: list[WalRecord] = []
        taken = 0
        trim = self.header.trim_offset
        while self.result is None and taken < _BATCH_BYTES:
            rec = self._step()
            if rec is not None and rec.offset >= trim:
                out.append(rec)
                taken += len(rec.data) + RECORD_HEADER_SIZE
        return out

    def _header_at(self, pos: int) -> RecordHeader | None:
        view = self.reader.get(self.layout.phys(pos), RECORD_HEADER_SIZE)
        if view is None:
            return None
        h = decode_record_header(view)
        if h is None or h.wal_id != self.header.wal_id or h.offset != pos:
            return None
        return h

    def _step(self) -> WalRecord | None:
        pos = self.pos
        layout = self.layout
        block = layout.block
        if pos >= self.limit:
            self._finish(pos)
            return None
        rem = pos % block
        if rem:
            n = block - rem
            view = self.reader.get(layout.phys(pos), n)
            if view is not None and view == self._zeros[:n]:
                self.pos = pos + n  # zeros to the block boundary: the end of a write group
                return None
        h = self._header_at(pos)
        if h is None:
            self._invalid(pos)
            return None
        if h.magic == PAD_MAGIC:
            if pos + h.length > self.limit:
                self._invalid(pos)
                return None
            self.group_starts.append(pos)
            self.pos = pos + h.length
            return None
        assert h.magic == DATA_MAGIC
        phys = layout.phys(pos)
        if h.length > self.header.window or phys + RECORD_HEADER_SIZE + h.length > layout.device_bytes:
            self._invalid(pos)
            return None
        body = self.reader.get(phys + RECORD_HEADER_SIZE, h.length)
        if body is None or crc32c(body) != h.body_crc:
            self._invalid(pos)
            return None
        if h.flags & FLAG_FIRST:
            self.group_starts.append(pos)
        self.pos = pos + RECORD_HEADER_SIZE + h.length
        self.record_count += 1
        return WalRecord(pos, bytes(body))

    def _invalid(self, pos: int) -> None:
        block = self.layout.block
        bridge = align_up(pos, block)
        if bridge != pos and bridge < self.limit:
            h = self._header_at(bridge)
            if h is not None and h.magic == PAD_MAGIC:
                self.pos = bridge
                return
        if self.header.clean_end_offset == NO_CLEAN_END:
            self._look_ahead(pos)
        self._finish(pos)

    def _look_ahead(self, pos: int) -> None:
        """Count the write groups that start after the hole at ``pos``; too many is corruption."""
        block = self.layout.block
        stop = min(pos + self.header.window + block, self.limit)
        probe = align_up(pos + 1, block)
        later = 0
        while probe < stop:
            h = self._header_at(probe)
            if h is not None and h.magic == DATA_MAGIC and h.flags & FLAG_FIRST:
                later += 1
                if later >= self.header.inflight_groups:
                    raise WalCorruptionError(
                        f"invalid record followed by {later} later write groups (the last at offset {probe}), "
                        f"more than the {self.header.inflight_groups} a crash can leave in flight: not a torn tail",
                        position=self.layout.phys(pos),
                        offset=pos,
                    )
            probe += block

    def _finish(self, pos: int) -> None:
        clean = self.header.clean_end_offset
        if clean != NO_CLEAN_END and pos != clean:
            raise WalCorruptionError(
                f"log ends at offset {pos} but the WAL was closed cleanly at offset {clean}",
                position=self.layout.phys(pos),
                offset=pos,
            )
        self.result = ScanResult(pos, self.group_starts, self.record_count)
        self.reader.close()
