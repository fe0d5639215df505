"""``s3stream produce``: append generated records or stdin lines to N streams, printing each offset.

The N streams are the ones tagged ``name=<prefix>-<i>`` (``--name``, default ``produce``), created
when missing, so running the command again appends to the same streams. Generated records are
``--count`` per stream of ``--size`` bytes; with ``--stdin`` every non-empty input line is one record,
spread over the streams in turn. The streams are closed at the end, which forces their data up to
object storage.

Each acknowledged offset is printed as it is acknowledged, one flushed line each (``--json``: one
JSON object per line), then a summary line once the streams are closed (``--json``:
``{"summary": {...}}``). An acknowledged record is durable: if a later append or the final close
fails, the lines already printed say what is in, and stderr says not to write it again.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TextIO, cast

from s3stream._loop import run
from s3stream.cli.streams import add_engine_args, open_client, open_existing
from s3stream.engine.client import Client, Stream
from s3stream.errors import InvalidArgumentError
from s3stream.model import RecordBatch

INFLIGHT_MAX = 256
"""Appends awaited at once (appends of one stream keep their order: offsets are assigned at call time)."""


_ALPHABET = bytes(range(ord("a"), ord("z") + 1))


def generated_payload(stream_id: int, index: int, size_bytes: int) -> bytes:
    """A recognizable payload: ``s<stream>-r<index>:`` (index = the offset it is meant for) and a filler
    (the alphabet from letter ``index % 26`` on, repeated), cut to ``size_bytes``."""
    head = f"s{stream_id}-r{index}:".encode()
    filler_bytes = max(0, size_bytes - len(head))
    rotated = _ALPHABET[index % 26 :] + _ALPHABET[: index % 26]
    filler = (rotated * (filler_bytes // 26 + 1))[:filler_bytes]
    return (head + filler)[:size_bytes]


def generated_plan(streams: Sequence[Stream], count: int, size_bytes: int) -> Iterator[tuple[Stream, bytes]]:
    """``count`` generated payloads per stream, the streams in turn, each made only when it is taken
    (the appends draw it chunk by chunk, so no long run of payload building blocks the event loop).
    Each payload names the offset it is meant for, counted from the streams' ends at the call."""
    bases = [stream.next_offset for stream in streams]
    for i in range(count):
        for stream, base in zip(streams, bases, strict=True):
            yield stream, generated_payload(stream.stream_id, base + i, size_bytes)


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


Ack = Callable[[int, int, int], None]
"""Called with (stream_id, offset, bytes) as each append is acknowledged."""


async def append_all(plan: Iterable[tuple[Stream, bytes]], on_ack: Ack | None = None) -> list[dict[str, Any]]:
    """Append every (stream, payload) in order, at most INFLIGHT_MAX awaited at once; ``on_ack``
    hears of each acknowledgement as it comes. Returns the rows in plan order.

    ``plan`` is drawn INFLIGHT_MAX items at a time, each chunk only once the one before it is
    acknowledged: a lazy plan is never built ahead of the appends."""

    async def append_one(stream: Stream, payload: bytes) -> dict[str, Any]:
        offset = await stream.append(RecordBatch(payload))
        if on_ack is not None:
            on_ack(stream.stream_id, offset, len(payload))
        return {"stream_id": stream.stream_id, "offset": offset, "bytes": len(payload)}

    rows: list[dict[str, Any]] = []
    items = iter(plan)
    while chunk := list(itertools.islice(items, INFLIGHT_MAX)):
        # Every append of the chunk finishes (and is reported) before a failure is raised, so what
        # was printed when the error comes is all that was acknowledged.
        results = await asyncio.gather(
            *(append_one(stream, payload) for stream, payload in chunk), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result
        rows.extend(cast(list[dict[str, Any]], results))
    return rows


class AckPrinter:
    """Prints each acknowledged offset on its own flushed line (a table row, or a JSON line), then a
    summary; counts what was acknowledged so a failure can say it."""

    COLUMNS = ("stream_id", "offset", "bytes")

    def __init__(self, out: TextIO, *, as_json: bool) -> None:
        self.out = out
        self.as_json = as_json
        self.records = 0
        self.bytes = 0
        if not as_json:
            self._line("stream_id  offset      bytes")

    def _line(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def ack(self, stream_id: int, offset: int, size_bytes: int) -> None:
        self.records += 1
        self.bytes += size_bytes
        if self.as_json:
            self._line(json.dumps({"stream_id": stream_id, "offset": offset, "bytes": size_bytes}))
        else:
            self._line(f"{stream_id:<9}  {offset:<10}  {size_bytes}")

    def summary(self, streams: Sequence[Stream]) -> None:
        next_offsets = {stream.stream_id: stream.next_offset for stream in streams}
        if self.as_json:
            summary = {"records": self.records, "bytes": self.bytes, "next_offsets": next_offsets}
            self._line(json.dumps({"summary": summary}))
        else:
            ends = " ".join(f"{sid}:{end}" for sid, end in next_offsets.items())
            self._line(
                f"acknowledged {self.records} records ({self.bytes} bytes); streams closed, "
                f"next offsets {ends}"
            )

    def failed(self) -> None:
        """On stderr, before the error: what was acknowledged stays (the WAL holds it)."""
        if self.records:
            print(
                f"s3stream produce: the {self.records} records acknowledged above are durable: "
                "do not write them again",
                file=sys.stderr,
                flush=True,
            )


async def _produce(args: argparse.Namespace) -> int:
    if args.streams < 1 or args.count < 0 or args.size < 1:
        raise InvalidArgumentError("--streams and --size must be at least 1, --count at least 0")
    lines = [line.rstrip(b"\r\n") for line in sys.stdin.buffer] if args.stdin else []
    client = await open_client(args, create=True)
    printer: AckPrinter | None = None
    try:
        try:
            record_max = client.config.record_max_bytes
            if not args.stdin and args.size > record_max:
                raise InvalidArgumentError(f"--size {args.size} is above s3.record.size.max ({record_max})")
            streams = await named_streams(client, args.name, args.streams)
            plan: Iterable[tuple[Stream, bytes]]
            if args.stdin:
                payloads = (line for line in lines if line)
                plan = ((streams[i % len(streams)], p) for i, p in enumerate(payloads))
            else:
                plan = generated_plan(streams, args.count, args.size)
            printer = AckPrinter(sys.stdout, as_json=args.json)
            await append_all(plan, printer.ack)
            for stream in streams:
                await stream.close()
        finally:
            await client.close()
    except BaseException:
        if printer is not None:
            printer.failed()
        raise
    printer.summary(streams)
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
