"""The per-stream acknowledgement sequencer: persisted appends are released strictly in offset order.

WAL writes may complete out of order (several write groups in flight); a stream's appends must still
be acknowledged, and enter the LogCache, in the order their offsets were assigned (AutoMQ reference
3.8, the callback sequencer). A stream's appends are released in offset order, so an append whose
base offset is its stream's ``confirm_offset`` when it becomes durable is the next one to release:
the plain append's hot path checks exactly that and releases itself in line, with no queue entry
and no :class:`PendingAppend` (the usual case). A durable append whose predecessor is still in flight
waits in ``StreamHandle.waiting`` under its base offset; each release looks there for the append
starting at the new confirm offset (:func:`release_waiting`). An append that touches several streams
(an atomic group) takes its turn in each and is acknowledged once every one has released it.

When a stream's appends fail (:func:`fail_stream`: a failed WAL write, the engine failing), every
append waiting is failed at once and ``StreamHandle.append_failure`` fails the ones still in flight
when they complete.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from s3stream.engine.logcache import CachedBatch
from s3stream.engine.stream import PendingAppend, StreamHandle
from s3stream.engine.waltrim import WalTrimTracker
from s3stream.errors import S3StreamError
from s3stream.record import RECORD_HEADER_SIZE

Put = Callable[[CachedBatch, int, int], None]
"""``put(item, seq, wal_offset)``: a batch enters the LogCache (see :func:`release`)."""


def release(handle: StreamHandle, pending: PendingAppend, put: Put, live: WalTrimTracker) -> None:
    """Release ``pending``'s batches of the stream (its turn has come): into the LogCache through
    ``put``, moving the confirm offset; acknowledge it once every stream it touches has released it.

    A plain append's batch goes with its WAL offset (it was held by the trim tracker ``live`` since
    durable and is a per-block record from now on), a group's batches with its seq (a per-record
    entry) and an offset of -1."""
    stream_id = handle.stream_id
    if pending.by_stream is None:
        item = pending.item
        assert item is not None
        put(item, -1, live.unhold(pending.seq))
        handle.confirm_offset = item[2] + item[3]
    else:
        items = pending.by_stream.get(stream_id, ())
        if pending.error is not None:
            # Failed through another of its streams: nothing enters the cache, later appends go on.
            if items:
                handle.confirm_offset = items[-1][2] + items[-1][3]
            return
        for item in items:
            put(item, pending.seq, -1)
            handle.confirm_offset = item[2] + item[3]
    pending.remaining -= 1
    if pending.remaining == 0:
        pending.acked = True
        future = pending.future
        if future is not None and not future.done():
            future.set_result(None)


def release_waiting(handle: StreamHandle, put: Put, live: WalTrimTracker) -> None:
    """Release the waiting appends that continue the stream's confirm offset, in order."""
    waiting = handle.waiting
    while waiting:
        pending = waiting.pop(handle.confirm_offset, None)
        if pending is None:
            return
        release(handle, pending, put, live)


def take_turn(
    handle: StreamHandle, pending: PendingAppend, base_offset: int, put: Put, live: WalTrimTracker
) -> None:
    """The durable ``pending`` starts at ``base_offset`` in the stream: released now if that is the
    confirm offset (then the appends waiting behind it), else it waits for its predecessors."""
    if base_offset == handle.confirm_offset:
        release(handle, pending, put, live)
        if handle.waiting:
            release_waiting(handle, put, live)
    else:
        handle.waiting[base_offset] = pending


def wait_drained(handle: StreamHandle) -> asyncio.Future[None] | None:
    """A future done once every append submitted so far is released or failed (None: already)."""
    if handle.append_failure is not None or handle.confirm_offset == handle.next_offset:
        return None
    closer = PendingAppend(-1, {}, 1)  # no batches: "released" when the confirm offset gets there
    handle.waiting[handle.next_offset] = closer
    return closer.wait()


def fail_stream(
    handle: StreamHandle,
    failure: S3StreamError,
    live: WalTrimTracker,
    error_of: Callable[[PendingAppend], S3StreamError] | None = None,
) -> None:
    """Fail every unacknowledged append of the stream: those waiting now (with ``error_of(append)``,
    default ``failure``) and those in flight once they complete (with ``failure``). A durable plain
    append held by the trim tracker ``live`` is dropped from it (nothing to keep)."""
    if handle.append_failure is None:
        handle.append_failure = failure
    for pending in handle.waiting.values():
        item = pending.item
        if item is not None and pending.error is None:
            live.drop_held(pending.seq, RECORD_HEADER_SIZE + len(item[4]))
        pending.fail(failure if error_of is None else error_of(pending))
    handle.waiting.clear()
