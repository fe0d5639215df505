"""``s3stream buckets``: the buckets of a data dir with their health, objects, bytes and share of new
writes; ``s3stream buckets set-weights 0:1,1:1``: the live sharding weights.

``buckets`` is read-only, like ``streams`` (:mod:`s3stream.cli._metadata`): it reads the metadata
alone (the data dir's own, or ``--metadata-url``), contacts no bucket and no node, and writes nothing.
Per bucket id, in the recorded list order:

* ``uri``: the bucket as the storage binding records it (:mod:`s3stream.binding`), never with
  credentials; a data dir that records no bucket list shows its one storage as bucket 0;
* ``objects`` / ``bytes``: COMMITTED objects placed there (``MetadataStore.bucket_usage``: an object
  without a placement row counts for the first bucket; a replicated object counts for each bucket);
* ``health``, ``errors_recent``, ``last_error``, ``uploads_recent``, ``write_share``: from the figures
  each node publishes in the KV (``__s3stream/buckets.health/<node id>``, every few seconds while it
  runs). ``health`` is ``healthy`` when every reporting node sees the bucket healthy, ``unhealthy``
  when one does not, ``-`` when no node reported; errors and uploads are summed over the nodes;
  ``write_share`` is the bucket's part of those uploads (``-`` with none); ``last_error`` is the one of
  the newest report that has one. ``report_age_ms`` is the age of the newest report. A node that
  stopped leaves its last report behind: a report older than :data:`REPORT_STALE_MS` describes the
  past, so it counts for none of these figures (only ``report_age_ms`` shows it).

``set-weights`` writes the KV key ``__s3stream/buckets.weights`` (text ``id:w,id:w``) after checking
the weights against the recorded bucket ids: every id once, no other, ints >= 0 and not all 0
(InvalidArgumentError otherwise; NotFoundError when the metadata records no bucket list). It starts no
node; running nodes with ``s3.data.buckets.strategy = sharding`` apply the value within
``s3.data.buckets.weights.poll.ms``, and it wins over ``s3.data.buckets.weights`` from then on.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from s3stream._loop import run
from s3stream.binding import METADATA_FILE, RecordedStorage, recorded_storage_of, without_secrets
from s3stream.buckets.monitor import HEALTH_KEY_PREFIX, WEIGHTS_KEY
from s3stream.buckets.spec import format_weights, parse_bucket_list, parse_weights
from s3stream.cli._metadata import command_config, open_metadata_read_only, store_clock
from s3stream.cli.reassign import writable_metadata
from s3stream.cli.streams import DATA_DIR_ENV, add_engine_args, print_rows
from s3stream.errors import CorruptionError, InvalidArgumentError, NotFoundError
from s3stream.logfmt import redact
from s3stream.metadata.base import MetadataStore
from s3stream.metadata.sqlite_readonly import ReadOnlySqliteStore
from s3stream.metadata.url import parse_metadata_url

BUCKET_COLUMNS = (
    "bucket_id",
    "uri",
    "health",
    "objects",
    "bytes",
    "errors_recent",
    "uploads_recent",
    "write_share",
    "report_age_ms",
    "last_error",
)
_ENTRY_ID = re.compile(r"^\s*\d+@")
LOCAL_URI = "local objects/ folder"
"""The ``uri`` of a data dir whose objects are in its own ``objects/`` folder."""


@dataclass(frozen=True, slots=True)
class NodeReport:
    """One node's published bucket figures (the JSON of ``HEALTH_KEY_PREFIX + <node id>``)."""

    node_id: int
    at_ms: int
    buckets: Mapping[str, Mapping[str, Any]]

    @staticmethod
    def decode(node_id: int, value: bytes) -> NodeReport:
        try:
            fields = json.loads(value)
            at_ms, buckets = int(fields["at_ms"]), fields["buckets"]
            if not isinstance(buckets, dict) or not all(isinstance(v, dict) for v in buckets.values()):
                raise ValueError("buckets is not an object of objects")
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptionError(
                f"node {node_id}'s bucket report is not readable: {exc}",
                source=f"{HEALTH_KEY_PREFIX}{node_id}",
            ) from exc
        return NodeReport(node_id, at_ms, buckets)


def recorded_buckets(recorded: RecordedStorage | None, given: str | None) -> list[tuple[int, str]]:
    """``(bucket id, uri without credentials)`` in list order: the recorded list, else the one given
    (``--bucket-uri`` / ``s3.data.buckets``), else the data dir's local folder as bucket 0."""
    uri = recorded.bucket_uri if recorded is not None else given
    if recorded is not None and recorded.bucket_uri is None:
        return [(0, LOCAL_URI)]
    if not uri:
        return [(0, LOCAL_URI)]
    return [(e.bucket_id, _ENTRY_ID.sub("", without_secrets(e.uri))) for e in parse_bucket_list(uri)]


REPORT_STALE_MS = 60_000
"""A node's report older than this (12 of its publish intervals) no longer counts: the node stopped."""


def bucket_rows(
    buckets: Sequence[tuple[int, str]],
    usage: Mapping[int, tuple[int, int]],
    reports: Sequence[NodeReport],
    *,
    now_ms: int,
) -> list[dict[str, Any]]:
    """One row per bucket (see the module docstring for each column). Pure."""
    newest = sorted(reports, key=lambda r: r.at_ms, reverse=True)
    fresh = [r for r in newest if now_ms - r.at_ms <= REPORT_STALE_MS]
    uploads_total = sum(
        int(figures.get("uploads_recent", 0)) for r in fresh for figures in r.buckets.values()
    )
    rows = []
    for bucket_id, uri in buckets:
        seen = [(r, r.buckets[str(bucket_id)]) for r in fresh if str(bucket_id) in r.buckets]
        reported = [r for r in newest if str(bucket_id) in r.buckets]
        objects, size_bytes = usage.get(bucket_id, (0, 0))
        uploads = sum(int(f.get("uploads_recent", 0)) for _, f in seen)
        health = None
        if seen:
            health = "healthy" if all(bool(f.get("healthy")) for _, f in seen) else "unhealthy"
        last_error = next((str(f["last_error"]) for _, f in seen if f.get("last_error")), None)
        rows.append(
            {
                "bucket_id": bucket_id,
                "uri": uri,
                "health": health,
                "objects": objects,
                "bytes": size_bytes,
                "errors_recent": sum(int(f.get("errors_recent", 0)) for _, f in seen) if seen else None,
                "uploads_recent": uploads if seen else None,
                "write_share": round(uploads / uploads_total, 4) if seen and uploads_total else None,
                "report_age_ms": max(0, now_ms - reported[0].at_ms) if reported else None,
                "last_error": None if last_error is None else redact(last_error),
            }
        )
    return rows


async def read_reports(metadata: MetadataStore, node_ids: Sequence[int]) -> list[NodeReport]:
    """The published reports of ``node_ids`` (nodes that published none are left out)."""
    values = await asyncio.gather(*(metadata.kv_get(f"{HEALTH_KEY_PREFIX}{n}") for n in node_ids))
    return [NodeReport.decode(n, v) for n, v in zip(node_ids, values, strict=True) if v is not None]


async def open_metadata_only(args: argparse.Namespace) -> MetadataStore:
    """The metadata ``buckets`` reads, opened read-only: ``--metadata-url`` / ``s3.metadata.url``, else
    the data dir's ``metadata.db`` (NotFoundError when there is none). Nothing is created."""
    config = command_config(args)
    if config.metadata_url:
        return await open_metadata_read_only(parse_metadata_url(config.metadata_url))
    path = Path(args.data_dir) / METADATA_FILE
    if not await asyncio.to_thread(path.is_file):
        raise NotFoundError(f"no metadata at {path} (--data-dir, or ${DATA_DIR_ENV}; or --metadata-url)")
    return await ReadOnlySqliteStore.open(str(path))


async def _buckets(args: argparse.Namespace) -> int:
    config = command_config(args)
    metadata = await open_metadata_only(args)
    try:
        recorded = await recorded_storage_of(metadata)
        buckets = recorded_buckets(recorded, args.bucket_uri or config.data_buckets or None)
        usage = await metadata.bucket_usage(unplaced_bucket_id=buckets[0][0])
        node_ids = sorted({n.node_id for n in await metadata.list_nodes()} | {config.node_id})
        reports = await read_reports(metadata, node_ids)
        now_ms = store_clock(metadata)()
    finally:
        await metadata.close()
    print_rows(bucket_rows(buckets, usage, reports, now_ms=now_ms), BUCKET_COLUMNS, as_json=args.json)
    return 0


async def set_weights(metadata: MetadataStore, text: str) -> dict[int, int]:
    """Check ``text`` against the recorded bucket ids and write it to the weights KV key; the weights."""
    recorded = await recorded_storage_of(metadata)
    if recorded is None or recorded.bucket_uri is None:
        raise NotFoundError(
            "this metadata records no bucket list (no node opened it with several buckets yet): "
            "there is nothing to weigh"
        )
    ids = tuple(e.bucket_id for e in parse_bucket_list(recorded.bucket_uri))
    if len(ids) < 2:
        raise InvalidArgumentError(
            f"this metadata records one bucket ({without_secrets(recorded.bucket_uri)}): weights need several"
        )
    weights = parse_weights(text, ids)
    await metadata.kv_put(WEIGHTS_KEY, format_weights(weights).encode())
    return weights


async def _set_weights(args: argparse.Namespace) -> int:
    async with writable_metadata(args) as metadata:
        weights = await set_weights(metadata, args.weights)
    if args.json:
        print(json.dumps({str(k): v for k, v in sorted(weights.items())}))
    else:
        print(
            f"bucket weights {format_weights(weights)} written; nodes on the sharding strategy apply them "
            "within s3.data.buckets.weights.poll.ms"
        )
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "buckets",
        help="list the buckets: health, objects, bytes, recent errors, share of new writes (reads only)",
    )
    add_engine_args(parser)
    parser.set_defaults(func=lambda args: run(_buckets(args)))
    actions = parser.add_subparsers(dest="buckets_action", required=False, metavar="{set-weights}")
    weights = actions.add_parser(
        "set-weights",
        help="set the live sharding weights (id:w,id:w over every recorded bucket id); no node starts",
    )
    add_engine_args(weights)
    weights.add_argument("weights", metavar="ID:W,ID:W", help="e.g. 0:1,1:1 (a weight of 0: no new writes)")
    weights.set_defaults(func=lambda args: run(_set_weights(args)))
