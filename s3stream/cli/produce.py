"""``s3stream produce``: append generated records or stdin lines to N streams, printing each acknowledgement.

The N streams are the ones tagged ``name=<prefix>-<i>`` (``--name``, default ``produce``), created
when missing, so running the command again appends to the same streams. Generated records are
``--count`` per stream of ``--size`` bytes; with ``--stdin`` every non-empty input line is one record,
spread over the streams in turn. The streams are closed at the end, which forces their data up to
object storage.

Output: one line per record as soon as it is acknowledged (durable in the WAL), flushed at once
(``stream_id offset bytes``; with ``--json`` one JSON object per line), then a summary line
(``--json``: ``{"summary": {...}}``). Whatever fails later (another append, the close, the upload)
the lines already printed are the records that are stored: running the command again for them
would write them twice. The error says how many were acknowledged.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from collections.abc import Callable, Sequence
from typing import TextIO

from s3stream._loop import run
from s3stream.cli.streams import add_engine_args, open_client, open_existing
from s3stream.engine.client import Client, Stream
from s3stream.errors import InvalidArgumentError, S3StreamError
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


COLUMNS = ("stream_id", "offset", "bytes")


class AckPrinter:
    """Prints each acknowledged record on its own flushed line and counts what it printed."""

    def __init__(self, out: TextIO, *, as_json: bool) -> None:
        self.out = out
        self.as_json = as_json
        self.records = 0
        self.bytes = 0
        self.streams: set[int] = set()
        if not as_json:
            self._write("  ".join(COLUMNS))

    def ack(self, stream: Stream, offset: int, payload: bytes) -> None:
        stream_id, size_bytes = int(stream.stream_id), len(payload)
        self.records += 1
        self.bytes += size_bytes
        self.streams.add(stream_id)
        if self.as_json:
            self._write(json.dumps({"stream_id": stream_id, "offset": offset, "bytes": size_bytes}))
        else:
            self._write(f"{stream_id}  {offset}  {size_bytes}")

    def summary(self, *, closed: bool) -> None:
        counts = {
            "records": self.records,
            "bytes": self.bytes,
            "streams": len(self.streams),
            "closed": closed,
        }
        if self.as_json:
            self._write(json.dumps({"summary": counts}))
        else:
            state = "streams closed, data uploaded" if closed else "streams NOT closed"
            self._write(
                f"acknowledged {self.records} records ({self.bytes} bytes) in {len(self.streams)} streams; {state}"
            )

    def _write(self, line: str) -> None:
        self.out.write(line + "\n")
        self.out.flush()


async def append_all(
    plan: Sequence[tuple[Stream, bytes]], on_ack: Callable[[Stream, int, bytes], None]
) -> None:
    """Append every (stream, payload) in order, at most INFLIGHT_MAX in flight, calling ``on_ack(stream,
    offset, payload)`` as each is acknowledged (a stream's acknowledgements come in offset order). A
    failed append is raised once the others in flight have finished."""

    async def one(stream: Stream, payload: bytes) -> None:
        on_ack(stream, await stream.append(RecordBatch(payload)), payload)

    for start in range(0, len(plan), INFLIGHT_MAX):
        chunk = plan[start : start + INFLIGHT_MAX]
        results = await asyncio.gather(
            *(one(stream, payload) for stream, payload in chunk), return_exceptions=True
        )
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            raise failures[0]


async def _produce(args: argparse.Namespace) -> int:
    if args.streams < 1 or args.count < 0 or args.size < 1:
        raise InvalidArgumentError("--streams and --size must be at least 1, --count at least 0")
    lines = [line.rstrip(b"\r\n") for line in sys.stdin.buffer] if args.stdin else []
    client = await open_client(args, create=True)
    printer = AckPrinter(sys.stdout, as_json=args.json)
    closed = False
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
        await append_all(plan, printer.ack)
        for stream in streams:
            await stream.close()
        await client.close()
        closed = True
    except S3StreamError:
        if printer.records:
            print(f"s3stream produce: {acknowledged_note(printer)}", file=sys.stderr)
        raise
    finally:
        if not closed:
            with contextlib.suppress(S3StreamError):
                await client.close()
        printer.summary(closed=closed)
    return 0


def acknowledged_note(printer: AckPrinter) -> str:
    """What the user must know after a failure: which records are stored already."""
    return (
        f"the {printer.records} records printed before this error were acknowledged and are durable: "
        "do not write them again; the next open uploads them"
    )


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
