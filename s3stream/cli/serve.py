"""``s3stream serve``: run one node of a cluster until SIGINT or SIGTERM, printing what it gains and loses.

The node is a client on ``--data-dir`` (its WAL) with its id (``--node-id``, else ``s3.node.id``), on
the metadata of ``--metadata-url`` and the bucket of ``--bucket-uri``: every node of a cluster names
the same two. It follows :meth:`StreamClient.assignments` and prints one flushed line per event:
``gained stream S epoch E`` when it opened a stream (a reassignment to it, or a dead node's stream it
took over) and ``lost stream S epoch E`` when one moved away (``--json``: one JSON object per line).

``--produce RATE`` appends RATE generated records per second to every stream the node owns
(:mod:`s3stream.cli._synthetic`) and prints a rate line every ``--report-s`` seconds. A stream that
moved away stops being written (its later appends get ``MovedError``); a node whose session is lost
(fenced: its lease lapsed and another node took its streams over, or a newer session of its id
started) stops, closes and exits 2 with one line saying so. SIGINT or SIGTERM closes the node
cleanly (its streams are closed, their data uploaded) and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import time
from typing import Any

from s3stream._loop import run
from s3stream.cli._synthetic import SyntheticProducer, is_node_fence
from s3stream.cli.streams import add_engine_args, open_client
from s3stream.engine.client import Client
from s3stream.errors import ErrorCode, FencedError, InvalidArgumentError

FENCE_POLL_S = 0.2
"""How often the command looks whether the engine was fenced (with or without ``--produce``)."""
CLOSE_TIMEOUT_S = 120.0
"""A clean close uploads what the node holds; past this the command gives up waiting."""


class EventPrinter:
    """One flushed line per event, as text or JSON."""

    def __init__(self, *, node_id: int, as_json: bool) -> None:
        self.node_id = node_id
        self.as_json = as_json

    def line(self, kind: str, text: str, **fields: Any) -> None:
        if self.as_json:
            out = json.dumps(
                {"event": kind, "node_id": self.node_id, "time_s": round(time.time(), 3), **fields}
            )
        else:
            out = f"{time.strftime('%H:%M:%S')} node {self.node_id}: {text}"
        sys.stdout.write(out + "\n")
        sys.stdout.flush()


async def _follow(client: Client, printer: EventPrinter, producer: SyntheticProducer | None) -> None:
    epochs: dict[int, int] = {}
    async for event in client.streams.assignments():
        if event.kind == "gained" and event.stream is not None:
            epochs[event.stream_id] = event.stream.epoch
            printer.line(
                "gained",
                f"gained stream {event.stream_id} epoch {event.stream.epoch}",
                stream_id=event.stream_id,
                epoch=event.stream.epoch,
            )
            if producer is not None:
                producer.follow(event.stream)
        elif event.kind == "lost":
            epoch = epochs.pop(event.stream_id, None)
            printer.line(
                "lost",
                f"lost stream {event.stream_id} epoch {'?' if epoch is None else epoch}",
                stream_id=event.stream_id,
                epoch=epoch,
            )
            if producer is not None:
                producer.drop(event.stream_id)


async def _report(producer: SyntheticProducer, printer: EventPrinter, every_s: float) -> None:
    while True:
        await asyncio.sleep(every_s)
        rate, window_s = producer.tally.take_rate()
        streams = producer.streams
        printer.line(
            "rate",
            f"{rate:.0f} records/s acknowledged over {window_s:.1f} s on {len(streams)} stream(s) "
            f"{streams}; total {producer.tally.records}",
            records_per_s=round(rate, 1),
            window_s=round(window_s, 3),
            streams=streams,
            records=producer.tally.records,
        )


async def _watch_fence(client: Client) -> None:
    """Returns once the engine is fenced (it offers no event for that: a poll, every FENCE_POLL_S)."""
    while not client.engine.fenced:  # noqa: ASYNC110
        await asyncio.sleep(FENCE_POLL_S)


def _outcome(
    done: set[asyncio.Task[Any]], client: Client, producer: SyntheticProducer | None
) -> FencedError | None:
    """Why serving stopped: None for a signal; the node's fence; else the unexpected error is raised."""
    for task in done:
        error = None if task.cancelled() else task.exception()
        if error is not None and not is_node_fence(error):
            raise error
    if producer is not None and producer.failure is not None:
        raise producer.failure
    if producer is not None and producer.node_fenced is not None:
        return producer.node_fenced
    for task in done:
        error = None if task.cancelled() else task.exception()
        if isinstance(error, FencedError):
            return error
    if client.engine.fenced:
        return FencedError("the engine refused its work: session lost", code=ErrorCode.NODE_FENCED)
    return None


async def _serve(args: argparse.Namespace) -> int:
    if args.produce is not None and args.produce <= 0:
        raise InvalidArgumentError(
            f"--produce takes a positive rate (records/s per stream), got {args.produce}"
        )
    if args.report_s <= 0:
        raise InvalidArgumentError(f"--report-s must be positive, got {args.report_s}")
    if args.node_id is not None:
        args.settings = [*args.settings, f"s3.node.id={args.node_id}"]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    client = await open_client(args, create=True)
    printer = EventPrinter(node_id=client.engine.node_id, as_json=args.json)
    producer: SyntheticProducer | None = None
    if args.produce is not None:
        producer = SyntheticProducer(
            rate_per_s=args.produce,
            size_bytes=args.size,
            notice=lambda text: printer.line("stopped", text),
        )
    printer.line(
        "serving",
        f"serving as node {client.engine.node_id} epoch {client.engine.node_epoch} "
        f"(data dir {args.data_dir}); SIGINT or SIGTERM closes it",
        node_epoch=client.engine.node_epoch,
    )
    tasks = [
        asyncio.create_task(_follow(client, printer, producer), name="serve-follow"),
        asyncio.create_task(_watch_fence(client), name="serve-fence"),
        asyncio.create_task(stop.wait(), name="serve-stop"),
    ]
    if producer is not None:
        tasks.append(asyncio.create_task(producer.stopped.wait(), name="serve-producer"))
        tasks.append(asyncio.create_task(_report(producer, printer, args.report_s), name="serve-rate"))
    fenced: FencedError | None = None
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        fenced = _outcome(done, client, producer)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if producer is not None:
            await producer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(client.close(), CLOSE_TIMEOUT_S)
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    tally = producer.tally if producer is not None else None
    printer.line(
        "closed",
        "closed" if tally is None else f"closed; {tally.records} records ({tally.bytes} bytes) acknowledged",
        records=None if tally is None else tally.records,
    )
    if fenced is not None:
        raise FencedError(
            f"node {client.engine.node_id} epoch {client.engine.node_epoch} was fenced ({fenced}): its "
            "lease lapsed and another node took its streams over, or a newer session of this node id "
            "started; what it acknowledged stays; run serve again to rejoin",
            code=ErrorCode.NODE_FENCED,
        )
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="run one node of a cluster until SIGINT/SIGTERM, printing the streams it gains and loses",
    )
    add_engine_args(parser)
    parser.add_argument("--node-id", type=int, default=None, help="this node's id (default s3.node.id)")
    parser.add_argument(
        "--produce",
        type=float,
        default=None,
        metavar="RATE",
        help="append RATE generated records/s to every stream the node owns",
    )
    parser.add_argument("--size", type=int, default=100, help="bytes per generated record (default 100)")
    parser.add_argument(
        "--report-s", type=float, default=5.0, help="seconds between rate lines with --produce (default 5)"
    )
    parser.set_defaults(func=lambda args: run(_serve(args)))
