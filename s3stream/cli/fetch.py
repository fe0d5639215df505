"""``s3stream fetch``: print the record batches of a stream range (offset, count, size, payload preview)."""

from __future__ import annotations

import argparse
from typing import Any

from s3stream._loop import run
from s3stream.cli.streams import add_engine_args, open_client, open_existing, print_rows
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


async def _fetch(args: argparse.Namespace) -> int:
    if args.start < 0 or (args.end is not None and args.end < args.start) or args.max_bytes < 1:
        raise InvalidArgumentError("need 0 <= --start <= --end and --max-bytes >= 1")
    client = await open_client(args)
    rows: list[dict[str, Any]] = []
    try:
        stream = await open_existing(client, StreamId(args.stream))
        end = stream.confirm_offset if args.end is None else args.end
        if args.start > end:
            raise OffsetOutOfRangeError(
                f"--start {args.start} is beyond stream {stream.stream_id}'s confirm offset {end}"
            )
        offset = args.start
        while offset < end:
            batches = await stream.fetch(offset, end, args.max_bytes)
            if not batches:
                break
            rows.extend(batch_row(b) for b in batches)
            offset = batches[-1].end_offset
        await stream.close()
    finally:
        await client.close()
    print_rows(rows, ("offset", "count", "bytes", "payload"), as_json=args.json)
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("fetch", help="print the records of a stream range")
    add_engine_args(parser)
    parser.add_argument("--stream", type=int, required=True, help="stream id")
    parser.add_argument("--start", type=int, default=0, help="first offset (default 0)")
    parser.add_argument(
        "--end", type=int, default=None, help="end offset, exclusive (default: confirm offset)"
    )
    parser.add_argument("--max-bytes", type=int, default=1 << 20, help="bytes per fetch call (default 1 MiB)")
    parser.set_defaults(func=lambda args: run(_fetch(args)))
