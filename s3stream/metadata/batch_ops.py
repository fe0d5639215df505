"""Batched stream opens and closes: many streams of one node in one metadata transaction.

A move of many streams (``docs/decisions/0047-batched-stream-opens-and-closes.md``) opens them on
the target and closes them on the old owner. One transaction per stream costs a round trip and, on
PostgreSQL's SERIALIZABLE isolation, conflict retries between the opens; one transaction for the
batch costs one of each.

Each stream follows exactly the rules of :func:`~s3stream.metadata.stream_ops.open_stream` or
:func:`~s3stream.metadata.stream_ops.close_stream`. Outcomes are per stream: a stream refused
(fenced, owned elsewhere, moved to another node, missing, still open) gets its error in its
:class:`~s3stream.metadata.base.StreamOutcome` and writes nothing, while the others commit. The
batch as a whole is refused, with nothing written, only for what concerns every stream alike: bad
arguments (InvalidArgumentError) and a fenced node session (FencedError with a node code).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

from s3stream.errors import ErrorCode, FencedError, InvalidArgumentError, S3StreamError
from s3stream.ids import NodeId, StreamId
from s3stream.metadata import stream_ops
from s3stream.metadata.base import NodeInfo, StreamMetadata, StreamOutcome
from s3stream.metadata.controller import (
    GET_LIMIT_MAX,
    StateView,
    Txn,
    check_int,
    check_node,
    node_epoch_check,
)

BATCH_STREAMS_MAX = GET_LIMIT_MAX
"""Streams one open_streams or close_streams call may name."""

NODE_FENCE_CODES = frozenset(
    {ErrorCode.NODE_EPOCH_EXPIRED, ErrorCode.NODE_FENCED, ErrorCode.NODE_EPOCH_NOT_EXIST}
)


def check_requests(requests: Sequence[tuple[StreamId, int]]) -> list[tuple[StreamId, int]]:
    try:
        pairs = [(sid, epoch) for sid, epoch in requests]
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(
            f"requests must be a sequence of (stream_id, epoch) pairs, got {requests!r:.80}"
        ) from exc
    if len(pairs) > BATCH_STREAMS_MAX:
        raise InvalidArgumentError(f"at most {BATCH_STREAMS_MAX} streams per batch, got {len(pairs)}")
    seen: set[int] = set()
    for sid, epoch in pairs:
        check_int("stream_id", sid, low=0)
        check_int("epoch", epoch, low=0)
        if sid in seen:
            raise InvalidArgumentError(f"stream {sid} is named twice in one batch")
        seen.add(sid)
    return pairs


class _NodeReadCache:
    """A transaction's view that reads each node row once: the per-stream rules read the caller's
    node (and the nodes their rows name) for every stream, and no open or close writes a node row,
    so within one batch a node row read once stays what the transaction sees."""

    def __init__(self, view: StateView) -> None:
        self._view = view
        self._epochs: dict[NodeId, int | None] = {}
        self._nodes: dict[NodeId, NodeInfo | None] = {}

    def node_epoch(self, node_id: NodeId) -> int | None:
        if node_id not in self._epochs:
            self._epochs[node_id] = self._view.node_epoch(node_id)
        return self._epochs[node_id]

    def node(self, node_id: NodeId) -> NodeInfo | None:
        if node_id not in self._nodes:
            self._nodes[node_id] = self._view.node(node_id)
        return self._nodes[node_id]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._view, name)


def _each(
    txn: Txn, pairs: list[tuple[StreamId, int]], op: Callable[[StreamId, int], StreamMetadata | None]
) -> list[StreamOutcome]:
    """Run ``op`` per stream; a stream-level refusal drops that stream's changes (the view does not
    see the transaction's own writes, and streams of a batch are distinct, so the others are
    unaffected); a node-level fence propagates and aborts the batch."""
    view = txn.view
    txn.view = cast(StateView, _NodeReadCache(view))
    try:
        return _run_each(txn, pairs, op)
    finally:
        txn.view = view


def _run_each(
    txn: Txn, pairs: list[tuple[StreamId, int]], op: Callable[[StreamId, int], StreamMetadata | None]
) -> list[StreamOutcome]:
    outcomes: list[StreamOutcome] = []
    for sid, epoch in pairs:
        mark = len(txn.changes)
        try:
            stream = op(sid, epoch)
        except FencedError as exc:
            if exc.code in NODE_FENCE_CODES:
                raise
            del txn.changes[mark:]
            outcomes.append(StreamOutcome(sid, None, exc))
        except InvalidArgumentError:
            raise
        except S3StreamError as exc:
            del txn.changes[mark:]
            outcomes.append(StreamOutcome(sid, None, exc))
        else:
            outcomes.append(StreamOutcome(sid, stream, None))
    return outcomes


def open_streams(
    txn: Txn, *, node_id: NodeId, node_epoch: int, requests: Sequence[tuple[StreamId, int]], now_ms: int
) -> list[StreamOutcome]:
    """``open_stream`` of each ``(stream_id, epoch)`` for one node, in request order."""
    check_node(node_id, node_epoch)
    pairs = check_requests(requests)
    node_epoch_check(txn.view, node_id, node_epoch)
    return _each(
        txn,
        pairs,
        lambda sid, epoch: stream_ops.open_stream(
            txn, node_id=node_id, node_epoch=node_epoch, stream_id=sid, epoch=epoch, now_ms=now_ms
        ),
    )


def close_streams(
    txn: Txn, *, node_id: NodeId, node_epoch: int, requests: Sequence[tuple[StreamId, int]]
) -> list[StreamOutcome]:
    """``close_stream`` of each ``(stream_id, epoch)`` for one node, in request order; a closed
    stream's outcome carries no metadata (``stream`` None, ``error`` None)."""
    check_node(node_id, node_epoch)
    pairs = check_requests(requests)
    node_epoch_check(txn.view, node_id, node_epoch)

    def close(sid: StreamId, epoch: int) -> None:
        stream_ops.close_stream(txn, node_id=node_id, node_epoch=node_epoch, stream_id=sid, epoch=epoch)

    return _each(txn, pairs, close)
