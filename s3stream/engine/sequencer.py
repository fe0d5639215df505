"""The per-stream acknowledgement sequencer: persisted appends are released strictly in submission order.

WAL writes may complete out of order (several write groups in flight); a stream's appends must still
be acknowledged, and enter the LogCache, in the order their offsets were assigned (AutoMQ reference
3.8, the callback sequencer). Every stream keeps its unacknowledged appends in ``StreamHandle.queue``
(submission order); :func:`release_ready` pops the persisted head of that queue and stops at the first
append still in flight. An append that touches several streams (an atomic group) is acknowledged once
every one of them has released it.
"""

from __future__ import annotations

from collections.abc import Callable

from s3stream.engine.logcache import CachedBatch
from s3stream.engine.stream import PendingAppend, StreamHandle
from s3stream.engine.waltrim import WalTrimTracker
from s3stream.errors import S3StreamError
from s3stream.record import RECORD_HEADER_SIZE


def release_ready(
    handle: StreamHandle, put: Callable[[CachedBatch, int, int], None], live: WalTrimTracker
) -> None:
    """Pop the stream's persisted head appends in order, hand each batch to ``put`` (into the
    LogCache), move the confirm offset and acknowledge completed appends.

    ``put(item, seq, wal_offset)``: a plain append's batch with its WAL offset (it was held by the
    trim tracker ``live`` since durable and is a per-block record from now on), a group's batches
    with its seq (a per-record entry) and an offset of -1."""
    queue = handle.queue
    stream_id = handle.stream_id
    while queue and queue[0].persisted:
        pending = queue.popleft()
        if pending.error is not None:
            continue
        if pending.by_stream is None:
            item = pending.item
            assert item is not None
            put(item, -1, live.unhold(pending.seq))
            handle.confirm_offset = item[2] + item[3]
        else:
            for item in pending.by_stream[stream_id]:
                put(item, pending.seq, -1)
                handle.confirm_offset = item[2] + item[3]
        pending.remaining -= 1
        if pending.remaining == 0:
            pending.acked = True
            future = pending.future
            if future is not None and not future.done():
                future.set_result(None)


def fail_queue(
    handle: StreamHandle,
    error_of: Callable[[PendingAppend], S3StreamError],
    live: WalTrimTracker | None = None,
) -> None:
    """Fail every unacknowledged append of the stream (with ``error_of(append)``) and empty its queue;
    a durable plain append held by the trim tracker ``live`` is dropped from it (nothing to keep)."""
    for pending in handle.queue:
        item = pending.item
        if live is not None and pending.persisted and item is not None and pending.error is None:
            live.drop_held(pending.seq, RECORD_HEADER_SIZE + len(item[4]))
        pending.fail(error_of(pending))
    handle.queue.clear()
