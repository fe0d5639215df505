"""``s3stream streams``: the streams of an engine with their offsets, epochs and state.

Read-only (:mod:`s3stream.cli._readonly`): it works while another process owns the data dir and
changes nothing. ``end_offset`` includes the records still only in the WAL; ``uploaded_end`` is
where the stream's objects end.

This module also holds what every engine subcommand (produce, fetch, streams, objects, demo)
shares: the ``--data-dir / --bucket-uri / --config / --metadata-url / --json`` options, opening the
client, opening a stream for this process, and printing a table or JSON. ``owner`` is the node whose
range a stream's records continue in (its last range's node id), ``-`` when it has no range.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from s3stream import assembly
from s3stream._loop import run
from s3stream.cli._metadata import add_metadata_url_arg, command_config, open_read_view
from s3stream.cli._readonly import print_notes, readable_end
from s3stream.engine.client import Client, Stream
from s3stream.errors import NotFoundError
from s3stream.ids import StreamId
from s3stream.metadata.base import StreamMetadata, StreamState

DATA_DIR_ENV = "S3STREAM_DATA_DIR"
DATA_DIR_DEFAULT = "s3stream-data"


def add_engine_args(parser: argparse.ArgumentParser, *, tabular: bool = True) -> None:
    """The options every engine subcommand takes."""
    parser.add_argument(
        "--data-dir",
        default=os.environ.get(DATA_DIR_ENV, DATA_DIR_DEFAULT),
        help=f"engine directory: WAL, metadata, local objects (default ${DATA_DIR_ENV} or ./{DATA_DIR_DEFAULT})",
    )
    parser.add_argument(
        "--bucket-uri",
        default=None,
        help='put objects there instead of <data-dir>/objects, e.g. "0@s3://bucket?endpoint=...&pathStyle=true"',
    )
    parser.add_argument(
        "--config", default=None, metavar="FILE.toml", help="configuration file (AutoMQ key names)"
    )
    parser.add_argument(
        "-c",
        "--set",
        dest="settings",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a configuration key (AutoMQ name, e.g. -c s3.node.id=1); repeatable; wins over --config "
        "and the environment",
    )
    add_metadata_url_arg(parser)
    if tabular:
        parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


async def open_client(args: argparse.Namespace, *, create: bool = False) -> Client:
    """The client of ``--data-dir``; config from ``--config``, the ``S3STREAM_*`` environment and
    ``--metadata-url``.

    Only commands that write (``create``: produce, demo) make a new data dir; the others refuse a
    missing one (NotFoundError) rather than create a WAL file at a mistyped path and print nothing.
    """
    config = command_config(args)
    if not create and not await asyncio.to_thread(os.path.isdir, args.data_dir):
        raise NotFoundError(f"no data dir at {args.data_dir} (--data-dir, or ${DATA_DIR_ENV})")
    return await assembly.open_client(args.data_dir, bucket_uri=args.bucket_uri, config=config)


def next_epoch(meta: StreamMetadata) -> int:
    """The epoch a new owner opens with: the current one if the stream was left open by this node's
    previous process (reopening recovers it), the next one if it was closed."""
    if meta.epoch < 0:
        return 0
    return meta.epoch if meta.state == StreamState.OPENED else meta.epoch + 1


async def open_existing(client: Client, stream_id: StreamId) -> Stream:
    """Open an existing stream (NotFoundError if there is none) for this process."""
    meta = await client.engine.metadata.describe_stream(stream_id)
    return await client.streams.open_stream(stream_id, epoch=next_epoch(meta))


def print_rows(
    rows: Sequence[Mapping[str, Any]], columns: Sequence[str], *, as_json: bool, out: TextIO | None = None
) -> None:
    """Rows as an aligned table (columns in order; None shown as ``-``) or as one JSON array (None
    as ``null``)."""
    out = out or sys.stdout
    if as_json:
        json.dump([dict(row) for row in rows], out, indent=None, default=str)
        out.write("\n")
        return
    cells = [
        ["-" if row.get(c) is None and c in row else str(row.get(c, "")) for c in columns] for row in rows
    ]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
    out.write("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip() + "\n")
    for r in cells:
        out.write("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() + "\n")


def stream_rows(
    streams: Sequence[StreamMetadata], readable_ends: Mapping[int, int] | None = None
) -> list[dict[str, Any]]:
    """One row per stream; ``end_offset`` is where its records end (``readable_ends``, objects and
    WAL records not yet uploaded), ``uploaded_end`` where its objects end."""
    ends = readable_ends or {}
    return [
        {
            "stream_id": m.stream_id,
            "epoch": m.epoch,
            "state": m.state.name,
            "start_offset": m.start_offset,
            "end_offset": ends.get(m.stream_id, m.end_offset),
            "uploaded_end": m.end_offset,
            "ranges": len(m.ranges),
            "owner": owner_of(m),
            "tags": ",".join(f"{k}={v}" for k, v in sorted(m.tags.items())),
        }
        for m in sorted(streams, key=lambda m: m.stream_id)
    ]


def owner_of(meta: StreamMetadata) -> int | None:
    """The node a stream's last range belongs to (None: the stream has no range)."""
    return max(meta.ranges, key=lambda r: r.range_index).node_id if meta.ranges else None


STREAM_COLUMNS = (
    "stream_id",
    "epoch",
    "state",
    "owner",
    "start_offset",
    "end_offset",
    "uploaded_end",
    "ranges",
    "tags",
)


async def _streams(args: argparse.Namespace) -> int:
    view = await open_read_view(args)
    try:
        streams = await view.metadata.list_streams()
        ends: dict[int, int] = {
            m.stream_id: await readable_end(view, m.stream_id, m.end_offset) for m in streams
        }
    finally:
        await view.close()
    print_rows(stream_rows(streams, ends), STREAM_COLUMNS, as_json=args.json)
    print_notes(view)
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "streams", help="list streams with their offsets, epochs and state (reads only; works while in use)"
    )
    add_engine_args(parser)
    parser.set_defaults(func=lambda args: run(_streams(args)))
    from s3stream.cli._streams_create import add_create, create_streams  # it imports this module

    actions = parser.add_subparsers(dest="streams_action", required=False, metavar="{create}")
    create = actions.add_parser(
        "create", help="create streams in the metadata (no node starts); --to-node opens them there"
    )
    add_engine_args(create)
    add_create(create)
    create.set_defaults(func=lambda args: run(create_streams(args)))
