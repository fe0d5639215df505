"""Header writes and trim: the two alternating header copies, the trim offset and the reusable space.

A trim writes the header (alternating slots, sequence counter) on its own I/O thread while group
writes go on: the header's ``start_offset`` is a sealed group's start (in flight or not) or the
aligned end of the log, and space freed by a trim is reused only once that header write is durable
(a group is sealed against the start of the last *durable* header), so an overlapping header write
changes neither what a crash can leave behind nor the recovery rule (docs/format.md 4.2, 4.6).
Close writes its clean-close header once no group is in flight.
"""

from __future__ import annotations

import asyncio

from wal.errors import WalArgumentError, WalError, WalIOError
from wal.format import NO_CLEAN_END, WalHeader, encode_wal_header
from wal.recovery import align_up
from wal.state import WalState


class HeaderWriter(WalState):
    """Trims, and every header write: the new WAL's two copies, after recovery, on trim, at close."""

    async def trim(self, offset: int) -> None:
        """Drop every record whose offset is ``< offset``; returns once that is durable.

        ``offset`` may be any value up to :attr:`next_offset` (usually a record offset, or the offset
        just past the last record to drop). Space is reclaimed by whole write groups.
        """
        self._check_writable()
        if offset > self._tail:
            raise WalArgumentError(f"trim offset {offset} beyond the end of the log {self._tail}")
        if offset <= self._durable_trim:
            return
        if offset > self._trim_offset:
            self._trim_offset = offset
        fut: asyncio.Future[None] = self._loop.create_future()
        self._header_waiters.append(fut)
        self._schedule()
        await fut

    def _new_header(
        self, *, seq: int, trim_offset: int, start_offset: int, clean_end_offset: int
    ) -> WalHeader:
        """A header of this WAL and session (the configured sizes, owner and window) with these fields."""
        cfg = self._config
        return WalHeader(
            seq=seq,
            wal_id=self._wal_id,
            block_size=cfg.block_size_bytes,
            capacity=cfg.device_bytes,
            node_id=cfg.node_id,
            inflight_groups=cfg.groups_inflight_max,
            node_epoch=cfg.node_epoch,
            trim_offset=trim_offset,
            start_offset=start_offset,
            window=cfg.window_bytes,
            clean_end_offset=clean_end_offset,
        )

    def _start_header(self, *, clean: bool) -> None:
        """Hand a header write to an I/O thread. Groups sealed meanwhile still count the ring's room
        from the last durable header's start (:attr:`_flushed_start`), which only its completion moves:
        the space it frees is not written before it is durable. ``start`` is the first sealed group
        holding a record at or past the trim offset, durable or in flight: after a crash the scan
        from there finds the end at the first torn group, as it would from an earlier start."""
        trim = self._trim_offset
        groups = self._groups
        while groups and groups[0][1] <= trim:
            groups.popleft()
        start = groups[0][0] if groups else align_up(self._tail, self._layout.block)
        header = self._new_header(
            seq=self._seq + 1,
            trim_offset=trim,
            start_offset=start,
            clean_end_offset=align_up(self._tail, self._layout.block) if clean else NO_CLEAN_END,
        )
        self._header_job = (self._header_waiters, clean)
        self._header_waiters = []
        self._header_busy = True
        self._jobs.put((self._write_header_sync, header, self._header_done))

    def _header_done(self, header: WalHeader, error: BaseException | None) -> None:
        """On the loop: a header write finished; wake its trims (or close), run the pump again."""
        self._header_busy = False
        waiters, clean = self._header_job
        self._header_job = ([], False)
        if self._failure is not None:
            return
        if error is not None:
            self._header_waiters[:0] = waiters
            self._fail(
                error if isinstance(error, WalError) else WalIOError(f"WAL header write failed: {error!r}")
            )
            return
        self._seq = header.seq
        self._flushed_start = header.start_offset
        self._durable_trim = header.trim_offset
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)
        if clean:
            waiter = self._close_waiter
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
            return
        self._schedule()

    def _write_header_sync(self, header: WalHeader) -> None:
        block = self._layout.block
        buf = self._hbuf
        buf[:block] = self._zeros
        data = encode_wal_header(header)
        buf[: len(data)] = data
        with memoryview(buf) as view:
            self._device.write((header.seq % 2) * block, view[:block])
        self._device.sync()
        self.stats["headers"] += 1
