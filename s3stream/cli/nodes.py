"""``s3stream nodes``: the nodes registered in the metadata, their epochs, leases and the streams they own.

Read-only, like ``streams`` (:mod:`s3stream.cli._metadata`): it works on a data dir's own metadata or
on shared metadata (``--metadata-url``) and writes nothing.

Per node: ``epoch`` (the node epoch the database issued its current session), ``lease`` (``alive``
while the store's clock is below the lease's end, ``expired`` after it, ``unleased`` for a session
registered without a lease), ``lease_age_ms`` (time since its last heartbeat, or since it registered
when it never sent one; ``-`` when neither is known) and ``streams_owned`` (OPENED streams whose last
range is the node's). A node that owns a stream but is not registered (metadata written before nodes
were registered) is listed with lease ``unregistered``. Times are the store's clock: for PostgreSQL
the database server's, for SQLite this machine's.

The cluster's state follows the node table (:mod:`s3stream.cli._cluster_view`): per node
``wal_pending_bytes`` (un-uploaded WAL bytes at its last heartbeat, ``-`` unknown) and ``streams``
(the ids it owns); then the takeovers (each one in flight, with its taker and attempt, and the last
finished one per node) and the reassignments requested and not yet done. ``--json`` prints the node
rows only, each with these as ``wal_pending_bytes``, ``streams``, ``takeover`` (the node's takeover
row or null) and ``assignments_to`` (stream ids being moved to it).
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Sequence
from typing import Any

from s3stream._loop import run
from s3stream.cli._cluster_view import CLUSTER_COLUMNS, ClusterState, stream_ids_cell
from s3stream.cli._metadata import open_read_view, store_clock
from s3stream.cli.streams import add_engine_args, owner_of, print_rows
from s3stream.metadata.base import NodeInfo, StreamMetadata, StreamState

NODE_COLUMNS = ("node_id", "epoch", "lease", "lease_age_ms", "streams_owned")
UNLEASED = -1
"""``lease_expires_at_ms`` of a session registered without a lease (and "never" for the other times)."""


def lease_state(node: NodeInfo, now_ms: int) -> str:
    if node.lease_expires_at_ms == UNLEASED:
        return "unleased"
    return "alive" if now_ms < node.lease_expires_at_ms else "expired"


def lease_age_ms(node: NodeInfo, now_ms: int) -> int | None:
    """Time since the node's last heartbeat (its registration when it sent none); None: neither known."""
    since = node.heartbeat_at_ms if node.heartbeat_at_ms != UNLEASED else node.registered_at_ms
    return None if since == UNLEASED else max(0, now_ms - since)


def node_rows(
    nodes: Sequence[NodeInfo], streams: Sequence[StreamMetadata], *, now_ms: int
) -> list[dict[str, Any]]:
    """One row per node (by id), registered nodes and owners of OPENED streams alike."""
    owned = Counter(
        owner for m in streams if m.state == StreamState.OPENED and (owner := owner_of(m)) is not None
    )
    rows: dict[int, dict[str, Any]] = {
        n.node_id: {
            "node_id": n.node_id,
            "epoch": n.node_epoch,
            "lease": lease_state(n, now_ms),
            "lease_age_ms": lease_age_ms(n, now_ms),
            "streams_owned": owned.get(n.node_id, 0),
            "lease_expires_at_ms": n.lease_expires_at_ms,
            "heartbeat_at_ms": n.heartbeat_at_ms,
            "registered_at_ms": n.registered_at_ms,
        }
        for n in nodes
    }
    for owner, count in owned.items():
        if owner not in rows:
            rows[owner] = {
                "node_id": owner,
                "epoch": None,
                "lease": "unregistered",
                "lease_age_ms": None,
                "streams_owned": count,
                "lease_expires_at_ms": None,
                "heartbeat_at_ms": None,
                "registered_at_ms": None,
            }
    return [rows[node_id] for node_id in sorted(rows)]


async def _nodes(args: argparse.Namespace) -> int:
    view = await open_read_view(args)
    try:
        nodes = await view.metadata.list_nodes()
        streams = await view.metadata.list_streams()
        cluster = await ClusterState.read(view.metadata)
        now_ms = store_clock(view.metadata)()
    finally:
        await view.close()
    rows = cluster.add_to_node_rows(node_rows(nodes, streams, now_ms=now_ms), streams)
    if args.json:
        print_rows(rows, NODE_COLUMNS + CLUSTER_COLUMNS, as_json=True)
        return 0
    cells = [{**row, "streams": stream_ids_cell(row["streams"])} for row in rows]
    print_rows(cells, NODE_COLUMNS + CLUSTER_COLUMNS, as_json=False)
    cluster.print_sections(now_ms=now_ms)
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "nodes",
        help="list nodes (epochs, leases, owned streams, WAL not uploaded), takeovers and pending "
        "reassignments (reads only)",
    )
    add_engine_args(parser)
    parser.set_defaults(func=lambda args: run(_nodes(args)))
