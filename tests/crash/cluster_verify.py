"""The end-of-run checks of the cluster tests: the ack logs against the streams, and the bucket after GC.

Run once every node has stopped. :func:`read_logs` gathers what the producers logged (``soak_node``
log lines); :func:`check_records` reads every stream through ``open_reader`` and returns the violations
of: every acknowledged record is readable exactly once at the offset it was acknowledged at (an ack
whose offset holds another record is an ack of a fenced node), every record read was acknowledged or
is unknown (logged ``U``, or ``T`` with no outcome: the process died) and none was refused as not
owned (``MovedError``, ``NotOwnerError``: never written), offsets are contiguous from
the stream's start to its end. :func:`collect_and_check_bucket` runs GC with an orphan scan (TTLs 0)
until no PREPARED or MARK_DESTROYED object is left, then returns the keys in the bucket that are not
COMMITTED objects and the committed objects that are missing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from compaction.gc import GarbageCollector
from s3stream.assembly import open_reader
from s3stream.config import Config
from s3stream.errors import InvalidArgumentError
from s3stream.metadata.base import ObjectState, StreamState
from s3stream.metadata.url import open_metadata_store
from s3stream.objectformat import object_key, parse_object_key
from s3stream.storage.uri import open_storage

VIOLATIONS_SHOWN_MAX = 40
REFUSED_ERRORS = ("MovedError", "NotOwnerError")
"""Append errors that mean the record never reached the WAL (the stream was not, or no longer, held)."""


@dataclass
class Ack:
    stream_id: int
    offset: int
    record_id: str
    node_id: int
    node_epoch: int


@dataclass
class Logs:
    acks: dict[str, Ack] = field(default_factory=dict)
    unknown: set[str] = field(default_factory=set)
    """Ids whose append failed or whose outcome was never logged."""
    refused: set[str] = field(default_factory=set)
    """Ids whose append was refused as not owned here (MovedError, NotOwnerError): never written."""
    tried: dict[str, int] = field(default_factory=dict)
    """Id -> the stream it was appended to."""
    problems: list[str] = field(default_factory=list)


def read_logs(paths: Iterable[Path]) -> Logs:
    logs = Logs()
    for path in paths:
        lines = path.read_text().split("\n") if path.exists() else []
        for number, line in enumerate(lines):
            words = line.split()
            if not words:
                continue
            if number == len(lines) - 1:  # no newline: torn by a kill -9 (never fsynced as a whole)
                continue
            kind = words[0]
            if kind == "T" and len(words) == 3:
                if words[2] in logs.tried:
                    logs.problems.append(f"{path.name}: id {words[2]} tried twice")
                logs.tried[words[2]] = int(words[1])
            elif kind == "A" and len(words) == 6:
                ack = Ack(int(words[1]), int(words[2]), words[3], int(words[4]), int(words[5]))
                if ack.record_id in logs.acks:
                    logs.problems.append(f"{path.name}: id {ack.record_id} acknowledged twice")
                logs.acks[ack.record_id] = ack
            elif kind == "U" and len(words) >= 3:
                logs.unknown.add(words[2])
                if len(words) >= 4 and words[3] in REFUSED_ERRORS:
                    logs.refused.add(words[2])
            else:
                logs.problems.append(f"{path.name}:{number + 1}: unreadable line {line!r}")
    for record_id in logs.tried:
        if record_id not in logs.acks:
            logs.unknown.add(record_id)
    for record_id, ack in logs.acks.items():
        if record_id in logs.unknown:
            logs.problems.append(f"id {record_id} logged both acknowledged and failed")
        if logs.tried.get(record_id) != ack.stream_id:
            logs.problems.append(f"id {record_id} acknowledged on stream {ack.stream_id} without its T line")
    return logs


@dataclass
class StreamRead:
    stream_id: int
    state: StreamState
    start_offset: int
    end_offset: int
    records: list[tuple[int, int, str]]
    """(base offset, count, record id) in offset order."""


async def _read_streams(metadata_url: str, bucket_uri: str) -> list[StreamRead]:
    reads: list[StreamRead] = []
    async with await open_reader(bucket_uri=bucket_uri, metadata_url=metadata_url) as reader:
        for meta in await reader.list_streams():
            records: list[tuple[int, int, str]] = []
            offset = meta.start_offset
            while offset < meta.end_offset:
                batches = await reader.fetch(meta.stream_id, offset, meta.end_offset, max_bytes=1 << 20)
                for batch in batches:
                    records.append((batch.base_offset, batch.count, batch.payload.decode()))
                    offset = batch.end_offset
            reads.append(
                StreamRead(int(meta.stream_id), meta.state, meta.start_offset, meta.end_offset, records)
            )
    return reads


def read_streams(metadata_url: str, bucket_uri: str) -> list[StreamRead]:
    return asyncio.run(_read_streams(metadata_url, bucket_uri))


def check_records(logs: Logs, reads: list[StreamRead]) -> list[str]:
    """Every violation of the record properties (empty: all hold)."""
    violations = list(logs.problems)
    where: dict[str, tuple[int, int]] = {}
    at: dict[tuple[int, int], str] = {}
    for read in reads:
        if read.state != StreamState.CLOSED:
            violations.append(f"stream {read.stream_id} is still {read.state.name} after every node stopped")
        expected = read.start_offset
        for base, count, record_id in read.records:
            if base != expected:
                violations.append(
                    f"stream {read.stream_id}: gap or overlap at {expected} (next batch {base})"
                )
            expected = base + count
            if count != 1:
                violations.append(f"stream {read.stream_id}@{base}: batch of {count} records")
            if record_id in where:
                violations.append(
                    f"record {record_id} read twice: stream {where[record_id]} and ({read.stream_id}, {base})"
                )
            where[record_id] = (read.stream_id, base)
            at[(read.stream_id, base)] = record_id
            if record_id not in logs.acks and record_id not in logs.unknown:
                violations.append(f"stream {read.stream_id}@{base}: record {record_id} was never appended")
            if record_id in logs.refused:
                violations.append(
                    f"stream {read.stream_id}@{base}: record {record_id} was refused, yet it is there"
                )
        if expected != read.end_offset:
            violations.append(
                f"stream {read.stream_id}: read up to {expected}, metadata end {read.end_offset}"
            )
    for ack in logs.acks.values():
        found = at.get((ack.stream_id, ack.offset))
        if found == ack.record_id:
            continue
        if found is None:
            violations.append(
                f"acked {ack.record_id} (node {ack.node_id} epoch {ack.node_epoch}) at stream "
                f"{ack.stream_id}@{ack.offset}: nothing there (lost; read at {where.get(ack.record_id)})"
            )
        else:
            violations.append(
                f"acked {ack.record_id} (node {ack.node_id} epoch {ack.node_epoch}) at stream "
                f"{ack.stream_id}@{ack.offset} holds {found} (ack of a fenced node?; the acked id is at "
                f"{where.get(ack.record_id)})"
            )
    return violations


async def _collect_and_check(metadata_url: str, bucket_uri: str, timeout_s: float) -> list[str]:
    namespace = Config().namespace
    store = await open_metadata_store(metadata_url)
    storage = open_storage(bucket_uri)
    try:
        gc = GarbageCollector(store, storage, namespace=namespace, retention_ms=0, orphan_ttl_ms=0)
        deadline = time.monotonic() + timeout_s
        while True:
            await gc.collect(scan_orphans=True)
            objects = await store.list_objects()
            pending = [o for o in objects if o.state != ObjectState.COMMITTED]
            if not pending or time.monotonic() > deadline:
                break
            await asyncio.sleep(1.0)
        committed = {int(o.object_id) for o in objects if o.state == ObjectState.COMMITTED}
        violations = [f"object {int(o.object_id)} still {o.state.name} after GC" for o in pending]
        keys = [info.key async for info in storage.list("")]
        in_bucket: set[int] = set()
        for key in keys:
            try:
                object_id, key_namespace = parse_object_key(key)
            except InvalidArgumentError:
                if "/metadata-copy/" not in key and not key.startswith(f"{namespace}/metadata-copy/"):
                    violations.append(f"unexpected key in the bucket: {key}")
                continue
            if key_namespace != namespace:
                continue
            in_bucket.add(object_id)
            if object_id not in committed:
                violations.append(f"key {key} is not a committed object (leaked)")
        violations += [f"committed object {object_key(i, namespace)} missing" for i in committed - in_bucket]
        return violations
    finally:
        await storage.close()
        await store.close()


def collect_and_check_bucket(metadata_url: str, bucket_uri: str, timeout_s: float = 60.0) -> list[str]:
    return asyncio.run(_collect_and_check(metadata_url, bucket_uri, timeout_s))


def summary(violations: list[str]) -> str:
    shown = violations[:VIOLATIONS_SHOWN_MAX]
    more = len(violations) - len(shown)
    return "\n".join(shown) + (f"\n... and {more} more" if more > 0 else "")
