"""``s3stream streams create``: new streams in a cluster's metadata, optionally placed on a node at once.

A metadata-only client like ``reassign``: no node starts. Each new stream is CLOSED, without a range
(``MetadataStore.create_stream``); its creation is recorded under a registered node's current session
(``--to-node``'s, else the lowest registered node id), which is what the store's check on
``create_stream`` asks for; no node is fenced or woken by it. With ``--to-node N`` the new streams are
then reassigned to N and the command waits until N holds them open (as ``s3stream reassign``).
``--name PREFIX`` tags them ``name=<prefix>-<i>`` (i counting from the streams the prefix has).
"""

from __future__ import annotations

import argparse
import time

from s3stream.cli.reassign import MOVE_COLUMNS, TIMEOUT_S_DEFAULT, wait_moved, writable_metadata
from s3stream.cli.streams import print_rows
from s3stream.errors import InvalidArgumentError, NotFoundError
from s3stream.ids import NodeId, StreamId
from s3stream.metadata.base import MetadataStore, NodeInfo

COUNT_MAX = 100_000
CREATED_COLUMNS = ("stream_id", "name", "to_node")


async def creator_session(store: MetadataStore, to_node: int | None) -> NodeInfo:
    """The registered session the creation is recorded under: ``to_node``'s, else the lowest node id's."""
    nodes = sorted(await store.list_nodes(), key=lambda n: n.node_id)
    if to_node is not None:
        nodes = [n for n in nodes if n.node_id == to_node]
        if not nodes:
            raise NotFoundError(
                f"node {to_node} is not registered in this metadata (start it: s3stream serve)"
            )
    if not nodes:
        raise NotFoundError("no node is registered in this metadata: start one first (s3stream serve)")
    return nodes[0]


async def create_streams(args: argparse.Namespace) -> int:
    if not 1 <= args.count <= COUNT_MAX:
        raise InvalidArgumentError(f"--count must be 1..{COUNT_MAX}, got {args.count}")
    async with writable_metadata(args) as store:
        session = await creator_session(store, args.to_node)
        taken = sum(
            1 for m in await store.list_streams() if m.tags.get("name", "").startswith(f"{args.name}-")
        )
        created: list[tuple[StreamId, str]] = []
        for i in range(args.count):
            name = f"{args.name}-{taken + i}"
            stream_id = await store.create_stream(
                node_id=session.node_id, node_epoch=session.node_epoch, tags={"name": name}
            )
            created.append((stream_id, name))
        if args.to_node is None:
            rows = [{"stream_id": s, "name": n, "to_node": None} for s, n in created]
            print_rows(rows, CREATED_COLUMNS, as_json=args.json)
            return 0
        started_s = time.monotonic()
        ids = [s for s, _ in created]
        await store.request_reassign(stream_ids=ids, to_node_id=NodeId(args.to_node))
        moves = await wait_moved(
            store,
            ids,
            NodeId(args.to_node),
            started_s=started_s,
            timeout_s=args.timeout,
            from_nodes=dict.fromkeys(ids),
        )
    print_rows([m.row() for m in moves], MOVE_COLUMNS, as_json=args.json)
    return 0


def add_create(parser: argparse.ArgumentParser) -> None:
    """The ``create`` options (``parser`` already has the engine options)."""
    parser.add_argument("--count", type=int, default=1, help="number of streams (default 1)")
    parser.add_argument(
        "--name", default="stream", help="name tag prefix: name=<prefix>-<i> (default stream)"
    )
    parser.add_argument(
        "--to-node", type=int, default=None, metavar="N", help="open them on node N (waits, as reassign)"
    )
    parser.add_argument(
        "--timeout", type=float, default=TIMEOUT_S_DEFAULT, metavar="SECONDS", help="with --to-node"
    )
