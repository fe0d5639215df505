"""``s3stream demo``: a short end-to-end run on the embedded default, then what it stored.

Creates (or reuses) three streams, appends generated records, closes the engine (which forces the
data up to object storage), reopens it so nothing is left in memory, fetches every record back from
object storage and checks it byte for byte, then prints the streams, the objects and a summary of
one object's layout. Exit code 0 when every record came back, 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from s3stream._loop import run
from s3stream.cli.inspect import print_text
from s3stream.cli.objects import OBJECT_COLUMNS, object_rows
from s3stream.cli.produce import append_all, generated_payload, named_streams
from s3stream.cli.streams import (
    STREAM_COLUMNS,
    add_engine_args,
    open_client,
    open_existing,
    print_rows,
    stream_rows,
)
from s3stream.engine.client import Client, Stream
from s3stream.ids import ObjectId, StreamId
from s3stream.metadata.base import ObjectState
from s3stream.objectformat import ObjectReader, object_key

DEMO_STREAMS = 3
DEMO_RECORDS = 200
DEMO_RECORD_BYTES = 1024


async def produce_phase(args: argparse.Namespace, out: TextIO) -> dict[int, list[tuple[int, bytes]]]:
    """Append the demo records; returns per stream the (offset, payload) pairs acknowledged."""
    client = await open_client(args, create=True)
    try:
        streams = await named_streams(client, "demo", DEMO_STREAMS)
        plan: list[tuple[Stream, bytes]] = []
        for stream in streams:
            base = stream.next_offset
            plan.extend(
                (stream, generated_payload(stream.stream_id, base + i, DEMO_RECORD_BYTES))
                for i in range(DEMO_RECORDS)
            )
        rows = await append_all(plan)
    finally:
        await client.close()  # closes the streams: their data goes up to object storage
    written: dict[int, list[tuple[int, bytes]]] = {}
    for (_, payload), row in zip(plan, rows, strict=True):
        written.setdefault(row["stream_id"], []).append((row["offset"], payload))
    total = sum(len(v) for v in written.values())
    out.write(f"produced {total} records of {DEMO_RECORD_BYTES} bytes into streams {sorted(written)}\n")
    return written


async def verify_phase(
    args: argparse.Namespace, written: dict[int, list[tuple[int, bytes]]], out: TextIO
) -> bool:
    """Reopen the engine and fetch every acknowledged record back; True when all match."""
    client = await open_client(args)
    ok = True
    try:
        for stream_id, records in sorted(written.items()):
            stream = await open_existing(client, StreamId(stream_id))
            start, end = records[0][0], records[-1][0] + 1
            got: dict[int, bytes] = {}
            offset = start
            while offset < end:
                batches = await stream.fetch(offset, end)
                if not batches:
                    break
                got.update((b.base_offset, b.payload) for b in batches)
                offset = batches[-1].end_offset
            bad = [o for o, p in records if got.get(o) != p]
            out.write(
                f"stream {stream_id}: fetched [{start}, {end}) back, {len(records) - len(bad)}/{len(records)} match\n"
            )
            ok = ok and not bad
            await stream.close()
        out.write(
            f"object reads: {client.engine.stats.object_reads} (the LogCache was empty after the reopen)\n"
        )
        await show_phase(client, out)
    finally:
        await client.close()
    return ok


async def show_phase(client: Client, out: TextIO) -> None:
    metadata = client.engine.metadata
    out.write("\nstreams:\n")
    print_rows(stream_rows(await client.streams.list_streams()), STREAM_COLUMNS, as_json=False, out=out)
    rows = await object_rows(metadata, node_id=client.engine.node_id, namespace=client.config.namespace)
    out.write("\nobjects:\n")
    print_rows(rows, OBJECT_COLUMNS, as_json=False, out=out)
    committed = [r for r in rows if r["state"] == ObjectState.COMMITTED.name]
    if committed:
        obj = await metadata.get_object(ObjectId(committed[-1]["object_id"]))
        key = object_key(obj.object_id, client.config.namespace)
        reader = await ObjectReader.open(client.engine.storage, key, obj.size_bytes)
        out.write(f"\ns3stream inspect object (of {key}):\n")
        print_text(reader, None, out)


async def run_demo(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """The demo job (kept in one function so another engine, e.g. a Spark job, can replace it)."""
    out = out or sys.stdout
    written = await produce_phase(args, out)
    ok = await verify_phase(args, written, out)
    out.write("\ndemo " + ("OK: every record came back from object storage\n" if ok else "FAILED\n"))
    return 0 if ok else 1


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="end-to-end run on the embedded default: produce, upload, fetch back, show what is stored",
    )
    add_engine_args(parser, tabular=False)
    parser.set_defaults(func=lambda args: run(run_demo(args)))
