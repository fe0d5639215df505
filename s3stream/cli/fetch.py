"""``s3stream fetch``: print the record batches of a stream range (offset, count, size, payload preview).

Read-only (:mod:`s3stream.cli._readonly`): records come from object storage and, past the stream's
uploaded end, from the WAL; it opens no stream (no epoch bump), works while another process owns
the data dir and changes nothing.
"""

from __future__ import annotations

import argparse
from typing import Any

from s3stream._loop import run
from s3stream.cli._metadata import open_read_view
from s3stream.cli._readonly import ReadOnlyView, print_notes
from s3stream.cli.streams import add_engine_args, print_rows
from s3stream.errors import InvalidArgumentError, OffsetOutOfRangeError
from s3stream.ids import StreamId
from s3stream.model import FetchedBatch

PREVIEW_BYTES = 40


def preview(payload: bytes, limit: int = PREVIEW_BYTES) -> str:
    """Printable ASCII as text, anything else as hex; ``...`` when cut."""
    head = payload[:limit]
    more = "..." if len(payload) > limit else ""
    if all(32 <= b < 127 for b in head):
        return head.decode("ascii") + more
    return "0x" + head.hex() + more


def batch_row(batch: FetchedBatch) -> dict[str, Any]:
    return {
        "offset": batch.base_offset,
        "count": batch.count,
        "bytes": len(batch.payload),
        "payload": preview(batch.payload),
    }


async def fetch_rows(
    view: ReadOnlyView, stream_id: StreamId, start: int, end: int | None, max_bytes: int
) -> list[dict[str, Any]]:
    """The rows of ``[start, end)`` of a stream: from its objects, then from its WAL records not yet
    uploaded; ``end`` None is where its records end. OffsetOutOfRangeError outside the records."""
    meta = await view.metadata.describe_stream(stream_id)
    pending = await view.unuploaded(stream_id, meta.end_offset)
    readable = pending[-1].base_offset + pending[-1].count if pending else meta.end_offset
    end = readable if end is None else end
    if start > readable:
        raise OffsetOutOfRangeError(
            f"--start {start} is beyond stream {stream_id}'s confirm offset {readable}"
        )
    if start < meta.start_offset or end > readable:
        raise OffsetOutOfRangeError(
            f"[{start}, {end}) is outside stream {stream_id}'s records [{meta.start_offset}, {readable})"
        )
    rows: list[dict[str, Any]] = []
    offset = start
    uploaded_end = min(end, meta.end_offset)
    while offset < uploaded_end:
        batches = await view.read_objects(stream_id, offset, uploaded_end, max_bytes)
        if not batches:
            break
        rows.extend(batch_row(b) for b in batches)
        offset = batches[-1].end_offset
    rows.extend(batch_row(b) for b in pending if b.end_offset > offset and b.base_offset < end)
    return rows


async def _fetch(args: argparse.Namespace) -> int:
    if args.start < 0 or (args.end is not None and args.end < args.start) or args.max_bytes < 1:
        raise InvalidArgumentError("need 0 <= --start <= --end and --max-bytes >= 1")
    view = await open_read_view(args, objects_needed=True)
    try:
        rows = await fetch_rows(view, StreamId(args.stream), args.start, args.end, args.max_bytes)
    finally:
        await view.close()
    print_rows(rows, ("offset", "count", "bytes", "payload"), as_json=args.json)
    print_notes(view)
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "fetch", help="print the records of a stream range (reads only; works while in use)"
    )
    add_engine_args(parser)
    parser.add_argument("--stream", type=int, required=True, help="stream id")
    parser.add_argument("--start", type=int, default=0, help="first offset (default 0)")
    parser.add_argument(
        "--end",
        type=int,
        default=None,
        help="end offset, exclusive (default: where the stream's records end)",
    )
    parser.add_argument("--max-bytes", type=int, default=1 << 20, help="bytes per fetch call (default 1 MiB)")
    parser.set_defaults(func=lambda args: run(_fetch(args)))
