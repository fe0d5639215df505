"""Group commit: sealing queued records into write groups, packing them, completing them in order.

The pump (a loop callback scheduled by :mod:`wal.intake`) seals the queued records into a *write
group* (up to ``batch_max_bytes``, 4 KiB aligned, never across the physical end of the device),
assigns their offsets and, in the same pass, packs headers, CRC32Cs and bodies into a reused aligned
buffer (:class:`wal.format.RecordPacker`); then hands the group to a write path (:mod:`wal.writer`).
Up to ``groups_inflight_max`` (K) groups are written at once; they complete (futures resolve)
strictly in offset order, and group n + K starts only after group n completed, which bounds what a
crash can leave behind (the recovery rule in docs/format.md section 4.6 and :mod:`wal.recovery`
depends on this). The pump runs again after the appenders a completion woke, so what they append
next joins the next group. When nothing is in flight and a large queue (256 KiB) waits, it is sealed
as two groups written at once (:data:`wal.state.SPLIT_MIN_BYTES`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from wal.errors import WalCapacityError, WalError, WalIOError
from wal.format import RECORD_HEADER_SIZE, RecordBody, body_len
from wal.recovery import align_up
from wal.state import Group, Queued, Req, WalState


class GroupCommit(WalState):
    """The writer's pump: seals and packs groups, keeps at most K in flight, completes them in order."""

    @property
    def used_bytes(self) -> int:
        """Bytes of the record area that are not yet reusable (sealed data above the durable start)."""
        return align_up(self._tail, self._layout.block) - self._flushed_start

    def _pump(self) -> None:
        """The writer's one step, run as a loop callback: start a header write for the waiting trims
        (one at a time, beside the group writes), seal and submit groups while fewer than K are in
        flight, and start the clean-close header once nothing is. Re-run by appends, completions,
        trims, header writes and close."""
        self._scheduled = False
        if self._failure is not None:
            return
        try:
            self._pump_once()
        except BaseException as exc:  # a bug: fail every waiter rather than hang them
            self._fail(exc if isinstance(exc, WalError) else WalIOError(f"WAL writer died: {exc!r}"))
            if not isinstance(exc, Exception):
                raise

    def _pump_once(self) -> None:
        inflight = self._inflight
        if self._header_waiters and not self._header_busy:
            self._start_header(clean=False)
        while self._pending and len(inflight) < self._k_max:
            split = 0
            if not inflight and self._pending_bytes >= self._split_min_bytes:
                split = self._pending_bytes // 2
            if self._seal_and_submit(split):
                continue
            if self._header_busy:
                return  # the trim being written may free room: its completion runs the pump again
            if self._config.on_full == "error" or self._closing:
                self._fail_pending(
                    WalCapacityError(
                        f"WAL full: {self.used_bytes} of {self._layout.area} bytes hold untrimmed records"
                    )
                )
            return  # on_full="wait": a trim runs the pump again
        if (
            self._closing
            and self._close_waiter is not None
            and not self._pending
            and not self._admit_waiters
            and not inflight
            and not self._header_busy
            and not self._header_waiters
        ):
            self._start_header(clean=True)

    def _seal_and_submit(self, split: int = 0) -> bool:
        """Seal and pack the queued records into one group (of at most ``split`` bytes if not 0) and
        hand its write to a write path. False when the ring has no room for the first queued record.
        """
        group = self._seal_and_pack(self._free_slots[-1], split)
        if group is None:
            return False
        self._free_slots.pop()
        self._inflight.append(group)
        self._submit(group)
        return True

    def _seal_and_pack(self, slot: int, split: int = 0) -> Group | None:
        """Take queued records into one group at the next aligned offset and pack their headers, CRCs
        and bodies into write buffer ``slot``; None if the ring is full.

        One pass over the records, on the event loop: the I/O thread then needs the GIL only around
        one ``pwrite``, so the two threads do not hand the GIL back and forth while a group is written.
        """
        layout = self._layout
        area = layout.area
        start = align_up(self._tail, layout.block)
        room_cycle = area - start % area
        room_ring = self._flushed_start + area - start
        first = self._pending[0]
        if first.__class__ is Req:
            req: Req = first
            k = req.sealed
            first_size = req.cum[k] - (req.cum[k - 1] if k else 0)
        else:
            first_size = body_len(first) + RECORD_HEADER_SIZE  # type: ignore[arg-type]
        pad_len = 0
        if first_size > room_cycle:
            pad_len = room_cycle
            start += room_cycle
            room_cycle = area
            room_ring -= pad_len
        if first_size > min(room_cycle, room_ring):
            return None
        limit = max(min(self._config.batch_max_bytes, room_cycle, room_ring, split or room_ring), first_size)
        items, item_futs, many = self._take(limit)
        group = Group(start, pad_len, slot)
        off = self._pack(group, items, item_futs, many)
        pos = off - start
        group.nbytes = pos
        group.records += len(group.futs)
        self._tail = off
        self._groups.append((start, off))
        end = align_up(pos, layout.block)
        if end != pos:
            self._wviews[slot][pos:end] = self._zeros[: end - pos]
        group.end = end
        return group

    def _pack(
        self, group: Group, items: list[Queued], item_futs: list[asyncio.Future[int] | None], many: int
    ) -> int:
        """Pack ``items`` (``many`` of them append_many calls) into the group's write buffer and note
        whom to complete with which offsets; returns the offset past the last record."""
        view = self._wviews[group.slot]
        if not many:  # the usual group: single appends only, one record each
            offs = self._packer.pack(view, group.first_offset, items)  # type: ignore[arg-type]
            end = offs.pop()
            group.futs = item_futs  # type: ignore[assignment]
            group.offs = offs
            return end
        bodies: list[RecordBody] = []
        for data, fut in zip(items, item_futs, strict=True):
            if fut is None:  # an append_many: its records from ``sealed`` to ``take``
                req: Req = data  # type: ignore[assignment]
                bodies += req.bodies[req.sealed : req.take]
            else:
                bodies.append(data)  # type: ignore[arg-type]
        offs = self._packer.pack(view, group.first_offset, bodies)
        i = 0
        for data, fut in zip(items, item_futs, strict=True):
            if fut is None:
                req = data  # type: ignore[assignment]
                count = req.take - req.sealed
                group.reqs.append((req, offs[i : i + count]))
                group.records += count
                group.req_bytes += req.cum[req.take - 1] - (req.cum[req.sealed - 1] if req.sealed else 0)
                req.sealed = req.take
                req.take = len(req.cum)
                i += count
            else:
                group.futs.append(fut)
                group.offs.append(offs[i])
                i += 1
        return offs[i]

    def _write_done(self, group: Group, error: BaseException | None) -> None:
        """On the loop: a group write finished. Complete what is now in order; then let the pump run
        after the appenders just woken (what they append next, in this turn, joins one group)."""
        if self._failure is not None:
            return
        group.error = error
        group.done = True
        if error is None:
            stats = self.stats
            stats["groups"] += 1
            stats["records"] += group.records
            stats["bytes_written"] += group.end
        inflight = self._inflight
        while inflight and inflight[0].done:
            head = inflight[0]
            if head.error is not None:
                exc = head.error
                self._fail(exc if isinstance(exc, WalError) else WalIOError(f"WAL write failed: {exc!r}"))
                return
            inflight.popleft()
            self._free_slots.append(head.slot)
            self._complete(head)
        if self._pending or self._header_waiters or self._closing:
            self._schedule()

    def _fail(self, exc: BaseException) -> None:
        """The WAL is failed: every pending, in-flight and waiting call raises ``exc``; close only
        releases the device."""
        if self._failure is not None:
            return
        self._failure = exc
        self._accepting = False
        self._fail_all(exc)
        waiter = self._close_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail_all(self, exc: BaseException) -> None:
        while self._inflight:
            group = self._inflight.popleft()
            futs: list[asyncio.Future[Any]] = [*group.futs, *(req.fut for req, _ in group.reqs)]
            for fut in futs:
                if not fut.done():
                    fut.set_exception(exc)
        waiters: list[asyncio.Future[Any]] = [f for _, f, _ in self._admit_waiters]
        self._admit_waiters.clear()
        self._admit_max_bytes = self._inflight_max_bytes
        self._fail_pending(exc)
        waiters += self._header_waiters
        self._header_waiters = []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_exception(exc)

    def _complete(self, group: Group) -> None:
        released = group.nbytes - group.req_bytes
        for fut, off in zip(group.futs, group.offs, strict=True):
            if not fut.done():  # (cancelled by its caller)
                fut.set_result(off)
        for req, offsets in group.reqs:
            req.offsets += offsets
            req.done += len(offsets)
            if req.done == len(req.cum):
                released += req.nbytes
                if not req.fut.done():
                    req.fut.set_result(req.offsets)
        if released:
            self._release_inflight(released)
