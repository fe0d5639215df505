"""Admission of appends: the queue of records not yet sealed and the bound on bytes in flight.

``append`` queues the body (or its parts) and returns a future; the first append of a loop turn
schedules the *pump* (:mod:`wal.groups`; a plain callback, no task), which runs after everything
already ready in that turn, so the appends of one turn form one group. An append counts its bytes
(header included) in flight from its admission until its group completes; past
``inflight_max_bytes`` it waits for room, in call order (FIFO), unless nothing is in flight.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
from collections.abc import Sequence
from typing import Any

from wal.errors import WalArgumentError, WalClosedError, WalStateError
from wal.format import RECORD_HEADER_SIZE, Body, RecordBody, body_len
from wal.state import Queued, Req, WalState

_H = RECORD_HEADER_SIZE

BodyParts = Body | Sequence[Body]
"""What :meth:`BlockWAL.append` takes: a body, or a list or tuple of parts written back to back as one
record (e.g. a header and a payload: no concatenation copy on the caller's side)."""


class Intake(WalState):
    """The appends' side of the WAL: argument checks, admission (in-flight bytes, FIFO waits), the queue."""

    def _check_writable(self) -> None:
        if self._failure is not None:
            raise WalClosedError(f"WAL failed: {self._failure}") from self._failure
        if self._closed or self._closing:
            raise WalClosedError("WAL is closed")
        if not self._recovered:
            raise WalStateError("recover() must run to the end before the first append")

    def append(self, data: BodyParts) -> asyncio.Future[int]:
        """Append one record; the returned future resolves to its logical offset once it is durable.

        ``data`` is the body (bytes-like), or a list or tuple of bytes-like parts that make the body
        back to back (e.g. a header and a payload, so the caller need not concatenate them; recovery
        returns the joined body). The bytes must not change until the future is done. Use as
        ``offset = await wal.append(data)``: a plain method, not a coroutine, so an append costs no
        coroutine frame; an invalid call or a closed WAL raises at once. Offsets follow call order.
        Cancelling the future does not withdraw the record: it may still become durable.
        """
        if not self._accepting:
            self._check_writable()
        cls = data.__class__
        if cls is bytes or cls is bytearray:
            n = len(data)
        else:
            data, n = _as_body(data)
        if n > self._record_max_bytes:
            raise WalArgumentError(f"record of {n} bytes above record_max_bytes {self._record_max_bytes}")
        size = n + _H
        fut: asyncio.Future[int] = self._new_future()
        inflight = self._inflight_bytes + size
        if inflight > self._admit_max_bytes and (self._admit_waiters or self._inflight_bytes):
            self._admit_waiters.append((size, fut, data))  # type: ignore[arg-type]
            self._admit_max_bytes = -1  # later appends queue behind this one
            return fut
        self._inflight_bytes = inflight
        self._pending_bytes += size
        self._pending.append(data)  # type: ignore[arg-type]
        self._pending_futs.append(fut)
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._pump)
        return fut

    async def append_many(self, records: Sequence[Body]) -> list[int]:
        """Append records in order (in as few group writes as fit); returns their offsets once durable.

        Not atomic: on an error, a prefix of the records may be durable and come back on recovery.
        """
        self._check_writable()
        if not records:
            return []
        if not all(r.__class__ is bytes or r.__class__ is bytearray for r in records):
            records = [
                r if r.__class__ is bytes or r.__class__ is bytearray else _as_view(r) for r in records
            ]
        rmax = self._config.record_max_bytes
        if max(map(len, records)) > rmax:
            raise WalArgumentError(f"a record is above record_max_bytes {rmax}")
        cum = list(itertools.accumulate(map(_H.__add__, map(len, records))))
        size = cum[-1]
        await self._admit(size)
        fut: asyncio.Future[list[int]] = self._loop.create_future()
        self._pending.append(Req(records, cum, fut))
        self._pending_many += 1
        self._pending_futs.append(None)
        self._pending_bytes += size
        self._schedule()
        return await fut

    async def _admit(self, size: int) -> None:
        cap = self._config.inflight_max_bytes
        if not self._admit_waiters and (self._inflight_bytes + size <= cap or not self._inflight_bytes):
            self._inflight_bytes += size
            return
        fut: asyncio.Future[None] = self._loop.create_future()
        self._admit_waiters.append((size, fut, None))
        self._admit_max_bytes = -1
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self._release_inflight(size)
            raise
        self._check_writable()

    def _release_inflight(self, size: int) -> None:
        self._inflight_bytes -= size
        cap = self._config.inflight_max_bytes
        waiters = self._admit_waiters
        while waiters:
            need, fut, item = waiters[0]
            if fut.done():  # cancelled while waiting: it takes no room
                waiters.popleft()
                continue
            if self._inflight_bytes + need > cap and self._inflight_bytes:
                break
            waiters.popleft()
            self._inflight_bytes += need
            if item is None:
                fut.set_result(None)
            else:
                self._pending.append(item)
                self._pending_futs.append(fut)
                self._pending_bytes += need
                self._schedule()
        if not waiters:
            self._admit_max_bytes = self._inflight_max_bytes

    def _schedule(self) -> None:
        """Run the pump soon: after the callbacks that are ready now (an appender woken in this turn
        appends before the pump seals)."""
        if not self._scheduled and self._started:
            self._scheduled = True
            self._loop.call_soon(self._pump)

    def _fail_pending(self, exc: BaseException) -> None:
        while self._pending:
            items, futs = self._pending, self._pending_futs
            self._pending, self._pending_futs = [], []
            self._pending_bytes = 0
            self._pending_many = 0
            for data, single in zip(items, futs, strict=True):
                fut: asyncio.Future[Any]
                if single is None:
                    req: Req = data  # type: ignore[assignment]
                    self._release_inflight(req.nbytes)
                    fut = req.fut
                else:
                    self._release_inflight(body_len(data) + _H)  # type: ignore[arg-type]
                    fut = single
                if not fut.done():
                    fut.set_exception(exc)

    def _take(self, limit: int) -> tuple[list[Queued], list[asyncio.Future[int] | None], int]:
        """The queued items (and their futures) that fill at most ``limit`` bytes, taken off the
        queue, in order, and how many of them are append_many calls; the first always fits. An
        append_many that fits in part is taken with ``take`` below its end and also stays first in the
        queue for the rest."""
        pending, futs = self._pending, self._pending_futs
        if self._pending_bytes <= limit:  # the usual case: everything queued fits
            many = self._pending_many
            self._pending, self._pending_futs = [], []
            self._pending_bytes = 0
            self._pending_many = 0
            return pending, futs, many
        used = 0
        count = 0
        many = 0
        partial = False
        for data in pending:
            if data.__class__ is not Req:
                size = body_len(data) + _H  # type: ignore[arg-type]
                if used + size > limit:
                    break
                used += size
                count += 1
                continue
            req: Req = data
            many += 1
            cum = req.cum
            base = cum[req.sealed - 1] if req.sealed else 0
            if used + cum[-1] - base <= limit:
                used += cum[-1] - base
                count += 1
                continue
            j = bisect.bisect_right(cum, base + limit - used, lo=req.sealed)
            if j > req.sealed:
                req.take = j
                used += cum[j - 1] - base
                partial = True
                count += 1
            else:
                many -= 1  # (not taken)
            break
        items, item_futs = pending[:count], futs[:count]
        keep = count - 1 if partial else count
        del pending[:keep]
        del futs[:keep]
        self._pending_bytes -= used
        self._pending_many -= many - partial
        return items, item_futs, many


def _as_view(data: Body) -> memoryview:
    """``data`` as a flat byte view (lengths are then byte counts); a typed error if it is not one."""
    try:
        return memoryview(data).cast("B")
    except TypeError as exc:
        raise WalArgumentError(
            f"a record body must be C-contiguous bytes-like, got {type(data).__name__}"
        ) from exc


def _as_body(data: BodyParts) -> tuple[RecordBody, int]:
    """A body given as a bytes-like object or as parts: what the write path packs, and its byte count."""
    if data.__class__ is tuple and len(data) == 2:  # (header, payload) of bytes: the engine's large appends
        head, tail = data
        if head.__class__ is bytes and tail.__class__ is bytes:
            return data, len(head) + len(tail)
    if isinstance(data, (list, tuple)):
        parts = tuple(p if p.__class__ is bytes or p.__class__ is bytearray else _as_view(p) for p in data)
        return parts, sum(map(len, parts))
    view = _as_view(data)  # type: ignore[arg-type]
    return view, len(view)
