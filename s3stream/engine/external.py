"""External commits on an open engine: reserve streams, drain and upload them, commit objects written elsewhere.

Objects written outside this engine's WAL (Spark executors, :mod:`s3stream.direct.writer`) are committed
by :meth:`~s3stream.metadata.base.MetadataStore.commit_objects`, which advances the streams' end offsets.
If that happened while this engine still held data of one of those streams in its WAL and LogCache, the
engine's own upload would later be refused and its acknowledged records dropped. So an external commit
(:func:`commit_external`) runs in this order, for the streams it names:

1. reserve: new appends fail with ConflictError naming the reservation (appends in flight finish);
2. drain: wait until every append submitted before is acknowledged or failed;
3. upload: force the streams' LogCache data up and wait for its commit (steps 2 and 3 give up after
   ``s3.close.timeout.ms`` with UnavailableError, nothing committed);
4. check: each stream's next offset == confirm offset == the metadata's end offset (a stream left
   reserved by an earlier commit with an unknown outcome first takes the metadata's end: while
   reserved, only that commit can have moved it);
5. commit: ``commit_objects``, one transaction;
6. bump: each handle's next and confirm offsets become the metadata's new end offset; release.

A commit whose outcome is unknown (the metadata store failed mid-call) leaves its streams reserved:
releasing them could let appends take offsets the commit may have used. The next
:func:`commit_external` of those streams settles it and releases them: the same request again is a
no-op if the first went through (and commits otherwise); another request is checked against the
ends the first one left. A caller that learns the outcome another way (a progress record the commit
wrote) and will not send the request again settles them with :func:`settle_external`: each stream
takes the metadata's end and is released.

KV: the keys of an external commit's ``kv_puts`` and ``kv_expect`` are under :data:`DIRECT_KV_PREFIX`,
which the WAL's KV path refuses (:mod:`s3stream.engine.kvlog`): a WAL replay re-applies only keys
written through the WAL, so it can never put back an older value of a key written here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING

from s3stream.engine.kvlog import DIRECT_KV_PREFIX
from s3stream.engine.sequencer import wait_drained
from s3stream.engine.stream import Status, StreamHandle
from s3stream.errors import (
    ConflictError,
    ErrorCode,
    FencedError,
    InvalidArgumentError,
    NotFoundError,
    UnavailableError,
)
from s3stream.ids import StreamId
from s3stream.metadata.base import CommitObjectsRequest

if TYPE_CHECKING:
    from s3stream.engine.core import Engine

EXTERNAL_COMMIT = "an external commit"
"""The reservation name of :func:`commit_external`."""

_DEFINITE = (ConflictError, FencedError, NotFoundError, InvalidArgumentError)
"""Errors of a metadata write that wrote nothing (a refused check), unlike an unavailable store."""


def reserve(handles: Sequence[StreamHandle], reason: str) -> None:
    """Reserve every handle (all or none): OPEN -> RESERVED. Reserving a stream already reserved for
    the same ``reason`` is a no-op; any other state raises what an append would (ClosedError,
    FencedError, or ConflictError naming the other reservation)."""
    for handle in handles:
        if handle.status is Status.RESERVED and handle.reservation == reason:
            continue
        handle.check_writable()
    for handle in handles:
        handle.status = Status.RESERVED
        handle.reservation = reason


def release(handles: Sequence[StreamHandle]) -> None:
    """RESERVED -> OPEN; a handle in another state (fenced meanwhile, never reserved) is left as is."""
    for handle in handles:
        if handle.status is Status.RESERVED:
            handle.status = Status.OPEN
            handle.reservation = ""


def _new_ends(request: CommitObjectsRequest) -> dict[StreamId, int]:
    ends: dict[StreamId, int] = {}
    for obj in request.objects:
        for r in obj.ranges:
            ends[r.stream_id] = max(ends.get(r.stream_id, r.end_offset), r.end_offset)
    return ends


def _check_request(engine: Engine, handles: Sequence[StreamHandle], request: CommitObjectsRequest) -> None:
    if (request.node_id, request.node_epoch) != (engine.node_id, engine.node_epoch):
        raise InvalidArgumentError(
            f"the request is for node {request.node_id} epoch {request.node_epoch}, this engine is node "
            f"{engine.node_id} epoch {engine.node_epoch}"
        )
    by_id = {h.stream_id: h for h in handles}
    if len(by_id) != len(handles):
        raise InvalidArgumentError("a stream is named twice")
    for handle in handles:
        if engine.streams.get(handle.stream_id) is not handle:
            raise InvalidArgumentError(f"stream {handle.stream_id} is not open in this engine")
    for stream_id, epoch in request.stream_epochs.items():
        named = by_id.get(stream_id)
        if named is None:
            raise InvalidArgumentError(f"stream {stream_id} of the request is not among the handles")
        if named.epoch != epoch:
            raise InvalidArgumentError(f"stream {stream_id} is open at epoch {named.epoch}, not {epoch}")
    for stream_id in _new_ends(request):
        if stream_id not in request.stream_epochs:
            raise InvalidArgumentError(f"stream {stream_id} has ranges but no epoch in the request")
    for key in (*request.kv_puts, *request.kv_expect):
        if not isinstance(key, str) or not key.startswith(DIRECT_KV_PREFIX):
            raise InvalidArgumentError(
                f"an external commit writes only KV keys under {DIRECT_KV_PREFIX!r} (never through the "
                f"WAL, so a replay cannot revert them), got {key!r:.80}"
            )


async def _drain_and_upload(engine: Engine, handles: Sequence[StreamHandle]) -> None:
    waits = [w for w in (wait_drained(h) for h in handles) if w is not None]
    if waits:
        await asyncio.gather(*waits, return_exceptions=True)
    for handle in handles:
        if handle.status is not Status.RESERVED:
            handle.check_writable()  # fenced meanwhile: its error
        if handle.append_failure is not None:
            raise handle.append_failure
    for handle in handles:
        await engine.force_upload(handle.stream_id)


async def _settle(engine: Engine, handle: StreamHandle) -> None:
    """Move a handle reserved since a commit of ours with an unknown outcome to the metadata's end.

    While reserved no append can move the handle, and only that commit can have moved the stream
    (this node owns it at this epoch): an end past the handle's offsets is that commit's, an equal
    end means it did not happen. An end below them, or a handle with unconfirmed appends, breaks
    that reasoning: ConflictError, the handle left as it is."""
    meta = await engine.metadata.describe_stream(handle.stream_id)
    if meta.end_offset > handle.next_offset == handle.confirm_offset:
        handle.next_offset = handle.confirm_offset = meta.end_offset
    elif not handle.next_offset == handle.confirm_offset == meta.end_offset:
        raise ConflictError(
            f"stream {handle.stream_id}: reserved by an external commit with an unknown outcome, the "
            f"engine is at offset {handle.next_offset} (confirmed {handle.confirm_offset}), metadata at "
            f"{meta.end_offset}: it cannot be settled",
            code=ErrorCode.OFFSET_NOT_MATCHED,
        )


def _unsettled(handles: Sequence[StreamHandle]) -> list[StreamHandle]:
    return [h for h in handles if h.status is Status.RESERVED and h.reservation == EXTERNAL_COMMIT]


async def settle_external(engine: Engine, handles: Sequence[StreamHandle]) -> int:
    """Settle the handles an external commit with an unknown outcome left reserved, without sending it
    again: each takes the metadata's end offset (:func:`_settle`) and is released; handles not
    reserved by an external commit are left alone. Returns how many were settled.

    A caller that will not retry the same request (its progress record shows the commit happened, or
    it plans anew from the metadata) calls this first; otherwise its handles stay reserved and their
    offsets stale until the next :func:`commit_external` of the same streams. If the metadata cannot
    be read, the error propagates and the handles stay reserved (settling later is still safe)."""
    unsettled = _unsettled(handles)
    for handle in unsettled:
        await _settle(engine, handle)
    release(unsettled)
    return len(unsettled)


async def commit_external(
    engine: Engine, handles: Sequence[StreamHandle], request: CommitObjectsRequest
) -> None:
    """Reserve, drain, upload, check, commit, bump, release (module docstring). ``handles``: every
    stream the request names (``stream_epochs``), open in this engine at those epochs."""
    _check_request(engine, handles, request)
    new_ends = _new_ends(request)
    unsettled = set(_unsettled(handles))
    reserve(handles, EXTERNAL_COMMIT)
    settled = True  # False only while the commit's outcome is unknown
    try:
        try:
            async with asyncio.timeout(engine.config.close_timeout_ms / 1000):
                await _drain_and_upload(engine, handles)
        except TimeoutError:
            raise UnavailableError(
                f"external commit gave up after s3.close.timeout.ms ({engine.config.close_timeout_ms} ms) "
                "waiting for its streams' data to upload: nothing was committed"
            ) from None
        for handle in handles:
            meta = await engine.metadata.describe_stream(handle.stream_id)
            if handle in unsettled and meta.end_offset > handle.next_offset == handle.confirm_offset:
                # Reserved since an earlier commit of ours with an unknown outcome, drained and
                # uploaded before it: only that commit can have moved the end, so it went through.
                handle.next_offset = handle.confirm_offset = meta.end_offset
            if not handle.next_offset == handle.confirm_offset == meta.end_offset:
                raise ConflictError(
                    f"stream {handle.stream_id}: the engine is at offset {handle.next_offset} (confirmed "
                    f"{handle.confirm_offset}), metadata at {meta.end_offset}: nothing was committed",
                    code=ErrorCode.OFFSET_NOT_MATCHED,
                )
        settled = False
        try:
            await engine.commit_objects_now(request)
        except _DEFINITE:
            settled = True  # refused by a check: nothing was written
            raise
        for handle in handles:
            end = new_ends.get(handle.stream_id)
            if end is not None:
                handle.next_offset = handle.confirm_offset = end
        settled = True
    finally:
        if settled:
            release(handles)
