"""``s3stream reassign``: move streams to a node and wait until that node holds each of them open.

A metadata-only client: it starts no node and holds no session. It writes the reassignment rows in
one transaction (``MetadataStore.request_reassign``: every stream must exist and the target node must
have a valid session, else nothing is written), then polls the metadata until each stream is OPENED
with its last range on the target (the old owner uploaded its pending data and closed it, the target
opened it at the next epoch). It prints, per stream, the node it came from, its new epoch and the
time from the request to that moment (``took_ms``).

Errors (one line, exit 2): an unknown stream (``NotFoundError``, STREAM_NOT_EXIST), a target without
a valid session (``NotFoundError``, NODE_NOT_ALIVE), and a move not finished within ``--timeout``
(``UnavailableError`` naming the streams still elsewhere; their rows stay and the nodes go on).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from s3stream import binding
from s3stream._loop import run
from s3stream.cli._metadata import command_config
from s3stream.cli.streams import DATA_DIR_ENV, add_engine_args, owner_of, print_rows
from s3stream.errors import InvalidArgumentError, NotFoundError, UnavailableError
from s3stream.ids import NodeId, StreamId
from s3stream.metadata.base import MetadataStore, StreamMetadata, StreamState
from s3stream.metadata.url import open_metadata_store

POLL_S = 0.01
"""How often the metadata is read while waiting (one read per stream still moving)."""
TIMEOUT_S_DEFAULT = 30.0
MOVE_COLUMNS = ("stream_id", "from_node", "to_node", "epoch", "took_ms")


@dataclass(frozen=True, slots=True)
class Move:
    """One finished move: where the stream came from, its epoch on the target, how long it took."""

    stream_id: StreamId
    from_node: int | None
    to_node: NodeId
    epoch: int
    took_ms: float

    def row(self) -> dict[str, Any]:
        return {
            "stream_id": self.stream_id,
            "from_node": self.from_node,
            "to_node": self.to_node,
            "epoch": self.epoch,
            "took_ms": round(self.took_ms, 1),
        }


@contextlib.asynccontextmanager
async def writable_metadata(args: argparse.Namespace) -> AsyncIterator[MetadataStore]:
    """The metadata store of ``--metadata-url`` / ``s3.metadata.url``, else the data dir's
    ``metadata.db`` (which must exist), opened for writing without a node session."""
    config = command_config(args)
    url = config.metadata_url
    if not url:
        path = Path(args.data_dir) / binding.METADATA_FILE
        if not await asyncio.to_thread(path.is_file):
            raise NotFoundError(
                f"no metadata at {path}: give --metadata-url (the cluster's), or --data-dir "
                f"(or ${DATA_DIR_ENV}) of a data dir with its own"
            )
        url = f"sqlite://{path.resolve()}"
    store: MetadataStore = await open_metadata_store(url)
    try:
        yield store
    finally:
        await store.close()


def on_node(meta: StreamMetadata, node_id: int) -> bool:
    """True once ``meta`` is OPENED with its last range on ``node_id``."""
    return meta.state == StreamState.OPENED and owner_of(meta) == node_id


async def wait_moved(
    store: MetadataStore,
    stream_ids: Sequence[StreamId],
    to_node: NodeId,
    *,
    started_s: float,
    timeout_s: float,
    from_nodes: dict[int, int | None],
) -> list[Move]:
    """Poll until every stream is OPENED on ``to_node``; the moves in ``stream_ids`` order.
    UnavailableError past ``timeout_s`` from ``started_s`` (``time.monotonic()``)."""
    moved: dict[int, Move] = {}
    pending = list(dict.fromkeys(stream_ids))
    deadline_s = started_s + timeout_s
    last: dict[int, StreamMetadata] = {}
    while pending:
        metas = await asyncio.gather(*(store.describe_stream(stream_id) for stream_id in pending))
        now_s = time.monotonic()
        for meta in metas:
            last[meta.stream_id] = meta
            if on_node(meta, to_node):
                moved[meta.stream_id] = Move(
                    meta.stream_id,
                    from_nodes.get(meta.stream_id),
                    to_node,
                    meta.epoch,
                    (now_s - started_s) * 1000,
                )
        pending = [stream_id for stream_id in pending if stream_id not in moved]
        if not pending:
            break
        if now_s >= deadline_s:
            where = ", ".join(
                f"{stream_id} ({last[stream_id].state.name} on node {owner_of(last[stream_id])})"
                for stream_id in pending[:10]
            )
            more = f" and {len(pending) - 10} more" if len(pending) > 10 else ""
            raise UnavailableError(
                f"{len(pending)} stream(s) not open on node {to_node} after {timeout_s:g} s: {where}{more}; "
                "the request stays (see s3stream nodes); is the node serving?"
            )
        await asyncio.sleep(POLL_S)
    return [moved[stream_id] for stream_id in dict.fromkeys(stream_ids)]


async def reassign(
    store: MetadataStore, stream_ids: Sequence[StreamId], to_node: NodeId, *, timeout_s: float
) -> list[Move]:
    """Request the moves (one transaction) and wait for them; see the module docstring."""
    if not stream_ids:
        raise InvalidArgumentError("give at least one stream")
    if timeout_s <= 0:
        raise InvalidArgumentError(f"--timeout must be positive, got {timeout_s}")
    started_s = time.monotonic()
    rows = await store.request_reassign(stream_ids=stream_ids, to_node_id=to_node)
    from_nodes: dict[int, int | None] = {stream_id: to_node for stream_id in stream_ids}
    for row in rows:
        from_nodes[row.stream_id] = None if row.from_node_id < 0 else row.from_node_id
    return await wait_moved(
        store, stream_ids, to_node, started_s=started_s, timeout_s=timeout_s, from_nodes=from_nodes
    )


async def _reassign(args: argparse.Namespace) -> int:
    async with writable_metadata(args) as store:
        moves = await reassign(
            store, [StreamId(s) for s in args.stream], NodeId(args.to_node), timeout_s=args.timeout
        )
    print_rows([m.row() for m in moves], MOVE_COLUMNS, as_json=args.json)
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "reassign",
        help="move streams to a node; waits until that node holds each open and prints the time taken",
    )
    add_engine_args(parser)
    parser.add_argument("--stream", type=int, nargs="+", required=True, metavar="S", help="stream ids")
    parser.add_argument("--to-node", type=int, required=True, metavar="N", help="the target node id")
    parser.add_argument(
        "--timeout",
        type=float,
        default=TIMEOUT_S_DEFAULT,
        metavar="SECONDS",
        help=f"give up waiting after this long (default {TIMEOUT_S_DEFAULT:g}; the request stays)",
    )
    parser.set_defaults(func=lambda args: run(_reassign(args)))
