"""``s3stream produce``: append generated records or stdin lines to N streams, printing the offsets.

The N streams are the ones tagged ``name=<prefix>-<i>`` (``--name``, default ``produce``), created
when missing, so running the command again appends to the same streams. Generated records are
``--count`` per stream of ``--size`` bytes; with ``--stdin`` every non-empty input line is one record,
spread over the streams in turn. The streams are closed at the end, which forces their data up to
object storage.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from typing import Any

from s3stream._loop import run
from s3stream.cli.streams import add_engine_args, open_client, open_existing, print_rows
from s3stream.engine.client import Client, Stream
from s3stream.errors import InvalidArgumentError
from s3stream.model import RecordBatch

INFLIGHT_MAX = 256
"""Appends awaited at once (appends of one stream keep their order: offsets are assigned at call time)."""


def generated_payload(stream_id: int, index: int, size_bytes: int) -> bytes:
    """A recognizable payload: ``s<stream>-r<index>:`` (index = the offset it is meant for) and a filler,
    cut to ``size_bytes``."""
    head = f"s{stream_id}-r{index}:".encode()
    filler = bytes(ord("a") + (index + i) % 26 for i in range(max(0, size_bytes - len(head))))
    return (head + filler)[:size_bytes]


async def named_streams(client: Client, prefix: str, count: int) -> list[Stream]:
    """Open the streams tagged ``name=<prefix>-<i>`` for i < count, creating the missing ones."""
    by_name = {m.tags.get("name"): m for m in await client.streams.list_streams()}
    out = []
    for i in range(count):
        name = f"{prefix}-{i}"
        meta = by_name.get(name)
        if meta is None:
            out.append(await client.streams.create_and_open_stream(tags={"name": name}))
        else:
            out.append(await open_existing(client, meta.stream_id))
    return out


async def append_all(plan: Sequence[tuple[Stream, bytes]]) -> list[dict[str, Any]]:
    """Append every (stream, payload) in order, at most INFLIGHT_MAX awaited at once."""
    rows: list[dict[str, Any]] = []
    for start in range(0, len(plan), INFLIGHT_MAX):
        chunk = plan[start : start + INFLIGHT_MAX]
        offsets = await asyncio.gather(*(stream.append(RecordBatch(payload)) for stream, payload in chunk))
        rows.extend(
            {"stream_id": stream.stream_id, "offset": offset, "bytes": len(payload)}
            for (stream, payload), offset in zip(chunk, offsets, strict=True)
        )
    return rows


async def _produce(args: argparse.Namespace) -> int:
    if args.streams < 1 or args.count < 0 or args.size < 1:
        raise InvalidArgumentError("--streams and --size must be at least 1, --count at least 0")
    lines = [line.rstrip(b"\r\n") for line in sys.stdin.buffer] if args.stdin else []
    client = await open_client(args, create=True)
    try:
        record_max = client.config.record_max_bytes
        if not args.stdin and args.size > record_max:
            raise InvalidArgumentError(f"--size {args.size} is above s3.record.size.max ({record_max})")
        streams = await named_streams(client, args.name, args.streams)
        if args.stdin:
            payloads = [line for line in lines if line]
            plan = [(streams[i % len(streams)], p) for i, p in enumerate(payloads)]
        else:
            plan = [
                (stream, generated_payload(stream.stream_id, stream.next_offset + i, args.size))
                for i in range(args.count)
                for stream in streams
            ]
        rows = await append_all(plan)
        for stream in streams:
            await stream.close()
    finally:
        await client.close()
    print_rows(rows, ("stream_id", "offset", "bytes"), as_json=args.json)
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "produce", help="append generated records or stdin lines to N streams, printing acknowledged offsets"
    )
    add_engine_args(parser)
    parser.add_argument("--streams", type=int, default=1, help="number of streams (default 1)")
    parser.add_argument("--count", type=int, default=10, help="generated records per stream (default 10)")
    parser.add_argument("--size", type=int, default=100, help="bytes per generated record (default 100)")
    parser.add_argument("--stdin", action="store_true", help="one record per non-empty stdin line")
    parser.add_argument("--name", default="produce", help="stream name prefix (tag name=<prefix>-<i>)")
    parser.set_defaults(func=lambda args: run(_produce(args)))
