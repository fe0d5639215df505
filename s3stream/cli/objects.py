"""``s3stream objects``: the objects of an engine with their kind, stream ranges, sizes and states.

Read-only (:mod:`s3stream.cli._readonly`): it reads the metadata only, works while another process
owns the data dir and changes nothing.
"""

from __future__ import annotations

import argparse
from typing import Any

from s3stream._loop import run
from s3stream.cli._metadata import open_read_view
from s3stream.cli.streams import add_engine_args, print_rows
from s3stream.ids import NodeId, ObjectId
from s3stream.metadata.base import MetadataStore
from s3stream.objectformat import object_key

OBJECT_COLUMNS = ("object_id", "kind", "state", "size_bytes", "ranges", "key")
_LIMIT = 100_000
"""The metadata store's largest query limit."""


async def object_rows(metadata: MetadataStore, *, node_id: NodeId, namespace: str) -> list[dict[str, Any]]:
    """One row per object the metadata knows, with the stream ranges it holds (``stream:[start,end)``).

    StreamSet objects are listed per node: those of ``node_id``, of every registered node and of every
    node that owns a stream range (metadata shared by several nodes holds each one's)."""
    streams = await metadata.list_streams()
    node_ids = {node_id, *(n.node_id for n in await metadata.list_nodes())}
    node_ids.update(r.node_id for stream in streams for r in stream.ranges)
    ranges: dict[ObjectId, list[str]] = {}
    for node in sorted(node_ids):
        for sso in await metadata.get_stream_set_objects(node):
            ranges[sso.object_id] = [f"{r.stream_id}:[{r.start_offset},{r.end_offset})" for r in sso.ranges]
    for stream in streams:
        if stream.end_offset <= stream.start_offset:
            continue
        for so in await metadata.get_stream_objects(
            stream_id=stream.stream_id, start_offset=stream.start_offset, end_offset=-1, limit=_LIMIT
        ):
            ranges[so.object_id] = [f"{so.stream_id}:[{so.start_offset},{so.end_offset})"]
    rows = []
    for obj in sorted(await metadata.list_objects(), key=lambda o: o.object_id):
        rows.append(
            {
                "object_id": obj.object_id,
                "kind": obj.kind.name if obj.kind is not None else "-",
                "state": obj.state.name,
                "size_bytes": obj.size_bytes,
                "ranges": " ".join(ranges.get(obj.object_id, [])) or "-",
                "key": object_key(obj.object_id, namespace),
            }
        )
    return rows


async def _objects(args: argparse.Namespace) -> int:
    view = await open_read_view(args)
    try:
        rows = await object_rows(
            view.metadata, node_id=NodeId(view.config.node_id), namespace=view.config.namespace
        )
    finally:
        await view.close()
    print_rows(rows, OBJECT_COLUMNS, as_json=args.json)
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "objects", help="list objects with their kind, stream ranges, sizes and states (reads only)"
    )
    add_engine_args(parser)
    parser.set_defaults(func=lambda args: run(_objects(args)))
