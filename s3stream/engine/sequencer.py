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
from s3stream.errors import S3StreamError


def release_ready(handle: StreamHandle, put: Callable[[CachedBatch, int], None]) -> None:
    """Pop the stream's persisted head appends in order, hand each batch with its append's seq to
    ``put`` (into the LogCache), move the confirm offset and acknowledge completed appends."""
    queue = handle.queue
    stream_id = handle.stream_id
    while queue and queue[0].persisted:
        pending = queue.popleft()
        if pending.error is not None:
            continue
        for item in pending.items(stream_id):
            put(item, pending.seq)
            handle.confirm_offset = item[2] + item[3]
        pending.remaining -= 1
        if pending.remaining == 0:
            pending.acked = True
            future = pending.future
            if future is not None and not future.done():
                future.set_result(None)


def fail_queue(handle: StreamHandle, error_of: Callable[[PendingAppend], S3StreamError]) -> None:
    """Fail every unacknowledged append of the stream (with ``error_of(append)``) and empty its queue."""
    for pending in handle.queue:
        pending.fail(error_of(pending))
    handle.queue.clear()
