"""``s3stream compact``: run a compaction now (StreamSet objects, stream objects, GC) and print its report.

Compaction and GC run on one node of a cluster at a time: the holder of the maintenance lease
(:mod:`compaction.maintenance`). The command takes (or renews) that lease for its node first and
refuses with ConflictError while another live node holds it; its compaction writes go through the
lease-guarded view of the store, so they are refused if the lease is lost meanwhile.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any, cast

from compaction.compactor import CompactionReport, Compactor
from compaction.maintenance import MAINTENANCE_LEASE, MaintenanceElection
from s3stream._loop import run
from s3stream.cli.streams import add_engine_args, open_client
from s3stream.engine.client import Client
from s3stream.errors import ConflictError
from s3stream.metadata.base import MetadataStore
from s3stream.metadata.store import TransactionalStore


def report_rows(report: CompactionReport) -> list[tuple[str, Any]]:
    """The report flattened to (name, value) rows; the GC part prefixed ``gc.``."""
    rows: list[tuple[str, Any]] = []
    for f in dataclasses.fields(report):
        value = getattr(report, f.name)
        if f.name == "gc":
            rows += [(f"gc.{g.name}", getattr(value, g.name)) for g in dataclasses.fields(value)]
        elif f.name == "problems":
            rows.append((f.name, "; ".join(value) or "-"))
        elif isinstance(value, float):
            rows.append((f.name, round(value, 1)))
        else:
            rows.append((f.name, value))
    return rows


async def maintenance_store(client: Client) -> MetadataStore:
    """The client's store as the maintenance lease's holder may write it; ConflictError when another
    node holds the lease."""
    election = client.components.get("maintenance")
    if isinstance(election, MaintenanceElection) and not await election.elect_once():
        lease = await client.engine.metadata.get_lease(MAINTENANCE_LEASE)
        holder = f"node {lease.node_id} (epoch {lease.node_epoch})" if lease is not None else "another node"
        raise ConflictError(
            f"{holder} holds the {MAINTENANCE_LEASE!r} lease: compaction and GC run there "
            "(see s3stream nodes); try again once its lease expired"
        )
    store = client.engine.metadata
    if isinstance(store, TransactionalStore) and store.bound_session is not None:
        return cast(MetadataStore, store.bind_lease(MAINTENANCE_LEASE))
    return store


async def _compact(args: argparse.Namespace) -> int:
    client = await open_client(args)
    try:
        engine = client.engine
        compactor = Compactor(
            client.config,
            await maintenance_store(client),
            engine.storage,
            node_id=engine.node_id,
            node_epoch=engine.node_epoch,
        )
        await engine.force_upload(None)  # compact what the WAL still holds too
        report = await compactor.run_once(stream_objects=True, scan_orphans=True)
    finally:
        await client.close()
    rows = report_rows(report)
    if args.json:
        json.dump(dict(rows), sys.stdout)
        sys.stdout.write("\n")
    else:
        width = max(len(name) for name, _ in rows)
        for name, value in rows:
            sys.stdout.write(f"{name.ljust(width)}  {value}\n")
    return 1 if report.problems else 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "compact", help="compact StreamSet and stream objects and collect garbage now; print the report"
    )
    add_engine_args(parser)
    parser.set_defaults(func=lambda args: run(_compact(args)))
