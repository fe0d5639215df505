"""The per-stream acknowledgement sequencer: persisted appends are released strictly in offset order.

WAL writes may complete out of order (several write groups in flight); a stream's appends must still be
acknowledged, and enter the LogCache, in the order their offsets were assigned (AutoMQ's callback sequencer,
``docs/automq-model.md`` section 4). A stream's appends are released in offset order, so an append whose base
offset is its stream's ``confirm_offset`` when it becomes durable is the next one to release: the plain
append's hot path checks exactly that and releases itself in line, with no queue entry and no
:class:`PendingAppend` (the usual case). A durable append whose predecessor is still in flight waits in
``StreamHandle.waiting`` under its base offset; each release looks there for the append starting at the new
confirm offset (:func:`release_waiting`).

An atomic group (one WAL record over several streams) is all or nothing in this process: it is
released into every stream it touches at once, when it has reached the confirm offset of each (until
then it is *parked* at the head of the streams it has reached, which wait for it), and acknowledged
then. Every wait points at an append with a smaller seq, so parked groups cannot wait in a cycle.

When a stream's appends fail (:func:`fail_stream`: a failed WAL write, the engine failing), every
append waiting is failed at once and ``StreamHandle.append_failure`` fails the ones still in flight
when they complete. A group that fails (through any of its streams, or its own WAL write) fails as a
whole (:func:`fail_group`): it was released nowhere, so each stream it touches now has offsets that
will never hold data, and is fenced (FencedError; its later appends fail), as any failed append
fences its stream; its batches leave the WAL trim tracker, so a failed group never pins the WAL.
Appends acknowledged before stay in the LogCache and are uploaded like any others. If the group's
record was durable, its outcome is indeterminate, as for any failed append: its KV puts are applied
in WAL order (recovery would replay them), and after a restart its batches come back in the streams
whose epoch is still this node's and whose earlier offsets the WAL still holds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from s3stream.engine.logcache import CachedBatch
from s3stream.engine.stream import PendingAppend, StreamHandle
from s3stream.engine.waltrim import WalTrimTracker
from s3stream.errors import FencedError, S3StreamError
from s3stream.record import RECORD_HEADER_SIZE

Put = Callable[[CachedBatch, int, int], None]
"""``put(item, seq, wal_offset)``: a batch enters the LogCache (see :func:`release`)."""


def release(
    handle: StreamHandle,
    pending: PendingAppend,
    put: Put,
    trim_tracker: WalTrimTracker,
    more: list[StreamHandle],
) -> bool:
    """``pending`` has reached the stream's confirm offset: release it (True) or park it (False).

    A plain append's batch enters the LogCache through ``put`` with its WAL offset (it was held by
    the trim tracker ``trim_tracker`` since durable and is a per-block record from now on), moving the
    confirm offset. A group is parked until it has reached the confirm offset of every stream it
    touches; then its batches enter with its seq (a per-record entry) and an offset of -1, in every
    stream at once, and its other streams are added to ``more`` (their waiting appends may go on)."""
    item = pending.item
    if item is not None:
        put(item, -1, trim_tracker.unhold(pending.seq))
        handle.confirm_offset = item.base_offset + item.record_count
    else:
        pending.remaining -= 1
        if pending.remaining:
            return False
        by_stream = pending.by_stream
        assert by_stream is not None
        seq = pending.seq
        for stream, items in by_stream.items():
            for batch in items:
                put(batch, seq, -1)
            last = items[-1]
            stream.confirm_offset = last.base_offset + last.record_count
            if stream is not handle:
                more.append(stream)
    pending.acked = True
    future = pending.future
    if future is not None and not future.done():
        future.set_result(None)
    return True


def release_waiting(handle: StreamHandle, put: Put, trim_tracker: WalTrimTracker) -> None:
    """Release the waiting appends that continue the stream's confirm offset, in order (and those of
    the other streams of a group released on the way)."""
    _drain([handle], put, trim_tracker)


def _drain(more: list[StreamHandle], put: Put, trim_tracker: WalTrimTracker) -> None:
    while more:
        stream = more.pop()
        waiting = stream.waiting
        while waiting:
            pending = waiting.pop(stream.confirm_offset, None)
            if pending is None or not release(stream, pending, put, trim_tracker, more):
                break


def take_turn(
    handle: StreamHandle, pending: PendingAppend, base_offset: int, put: Put, trim_tracker: WalTrimTracker
) -> None:
    """The durable ``pending`` starts at ``base_offset`` in the stream: released now if that is the
    confirm offset (then the appends waiting behind it), else it waits for its predecessors."""
    if base_offset != handle.confirm_offset:
        handle.waiting[base_offset] = pending
        return
    more: list[StreamHandle] = []
    if release(handle, pending, put, trim_tracker, more):
        more.append(handle)
        _drain(more, put, trim_tracker)


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
    trim_tracker: WalTrimTracker,
    error_of: Callable[[PendingAppend], S3StreamError] | None = None,
) -> None:
    """Fail every unacknowledged append of the stream: those waiting now (with ``error_of(append)``,
    default ``failure``) and those in flight once they complete (with ``failure``). A durable plain
    append held by the trim tracker ``trim_tracker`` is dropped from it (nothing to keep); a group fails as a
    whole (:func:`fail_group`), fencing and failing its other streams in turn."""
    failing = [(handle, failure, error_of)]
    while failing:
        stream, error, error_for = failing.pop()
        if stream.append_failure is None:
            stream.append_failure = error
        waiting = list(stream.waiting.values())
        stream.waiting.clear()
        for pending in waiting:
            if pending.acked or pending.error is not None:
                continue  # a group already failed through another of its streams
            item = pending.item
            if item is not None:
                trim_tracker.drop_held(pending.seq, RECORD_HEADER_SIZE + len(item.payload))
            reason = error if error_for is None else error_for(pending)
            if pending.by_stream:
                failing.extend(
                    (s, f, None) for s, f in _group_failed(pending, reason, trim_tracker) if s is not stream
                )
            else:
                pending.fail(reason)


def fail_group(pending: PendingAppend, error: S3StreamError, trim_tracker: WalTrimTracker) -> None:
    """The durable group ``pending`` cannot be released (one of its streams failed): fail it, drop
    its batches from the trim tracker (its KV puts stay live until applied) and fence and fail each
    stream it touches."""
    for stream, fence in _group_failed(pending, error, trim_tracker):
        fail_stream(stream, fence, trim_tracker)


def _group_failed(
    pending: PendingAppend, error: S3StreamError, trim_tracker: WalTrimTracker
) -> list[tuple[StreamHandle, S3StreamError]]:
    """Fail the group, drop its batches from ``trim_tracker`` and fence its streams: the streams to fail."""
    by_stream = pending.by_stream
    assert by_stream
    pending.fail(error)
    trim_tracker.committed([pending.seq] * sum(len(items) for items in by_stream.values()))
    fence = (
        error
        if isinstance(error, FencedError)
        else FencedError(f"stream fenced after a failed atomic group: {error}")
    )
    for stream in by_stream:
        stream.fence(fence)
    return [(stream, fence) for stream in by_stream]
