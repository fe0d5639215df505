"""What ``s3stream nodes`` shows of a cluster beyond its node sessions: WAL backlogs, takeovers, moves.

Read from the metadata in three reads (``list_node_runtime``, ``list_takeovers``,
``list_assignments``) on the read-only view; nothing is written. Times are the store's clock.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from s3stream.cli.streams import owner_of, print_rows
from s3stream.metadata.base import (
    Assignment,
    MetadataStore,
    NodeRuntime,
    StreamMetadata,
    StreamState,
    TakeoverInfo,
    TakeoverState,
)
from s3stream.metadata.node_ops import IN_FLIGHT

CLUSTER_COLUMNS = ("wal_pending_bytes", "streams")
TAKEOVER_COLUMNS = (
    "node_id",
    "node_epoch",
    "state",
    "taker",
    "attempt",
    "streams",
    "age_ms",
    "wal_end_offset",
)
ASSIGNMENT_COLUMNS = ("stream_id", "from_node", "to_node", "age_ms")
STREAM_IDS_SHOWN_MAX = 8
"""A node's ``streams`` cell lists at most this many ids, then ``+N``."""


def stream_ids_cell(stream_ids: Sequence[int]) -> str:
    if not stream_ids:
        return "-"
    shown = ",".join(str(s) for s in stream_ids[:STREAM_IDS_SHOWN_MAX])
    rest = len(stream_ids) - STREAM_IDS_SHOWN_MAX
    return shown + (f",+{rest}" if rest > 0 else "")


def takeover_row(takeover: TakeoverInfo, now_ms: int | None = None) -> dict[str, Any]:
    return {
        "node_id": takeover.node_id,
        "node_epoch": takeover.node_epoch,
        "fence_epoch": takeover.fence_epoch,
        "state": takeover.state.name,
        "taker": None if takeover.taker_node_id < 0 else takeover.taker_node_id,
        "taker_epoch": None if takeover.taker_node_epoch < 0 else takeover.taker_node_epoch,
        "attempt": takeover.attempt,
        "streams": [stream_id for stream_id, _ in takeover.streams],
        "age_ms": None if now_ms is None else max(0, now_ms - takeover.created_at_ms),
        "created_at_ms": takeover.created_at_ms,
        "updated_at_ms": takeover.updated_at_ms,
        "wal_end_offset": None if takeover.wal_end_offset < 0 else takeover.wal_end_offset,
    }


@dataclass(frozen=True, slots=True)
class ClusterState:
    runtime: tuple[NodeRuntime, ...]
    takeovers: tuple[TakeoverInfo, ...]
    assignments: tuple[Assignment, ...]

    @classmethod
    async def read(cls, metadata: MetadataStore) -> ClusterState:
        return cls(
            tuple(await metadata.list_node_runtime()),
            tuple(await metadata.list_takeovers()),
            tuple(await metadata.list_assignments()),
        )

    def takeover_of(self, node_id: int) -> TakeoverInfo | None:
        """The node's takeover in flight, else its last finished one, else None."""
        mine = sorted((t for t in self.takeovers if t.node_id == node_id), key=lambda t: t.created_at_ms)
        in_flight = [t for t in mine if t.state in IN_FLIGHT]
        chosen = in_flight or mine
        return chosen[-1] if chosen else None

    def add_to_node_rows(
        self, rows: list[dict[str, Any]], streams: Sequence[StreamMetadata]
    ) -> list[dict[str, Any]]:
        """``rows`` (one per node) with ``wal_pending_bytes``, ``streams``, ``takeover`` and
        ``assignments_to`` added."""
        pending = {r.node_id: r.wal_pending_bytes for r in self.runtime}
        owned: dict[int, list[int]] = {}
        for meta in sorted(streams, key=lambda m: m.stream_id):
            owner = owner_of(meta)
            if meta.state == StreamState.OPENED and owner is not None:
                owned.setdefault(owner, []).append(meta.stream_id)
        out = []
        for row in rows:
            node_id = row["node_id"]
            wal = pending.get(node_id, -1)
            takeover = self.takeover_of(node_id)
            out.append(
                {
                    **row,
                    "wal_pending_bytes": None if wal < 0 else wal,
                    "streams": owned.get(node_id, []),
                    "takeover": None if takeover is None else takeover_row(takeover),
                    "assignments_to": sorted(
                        a.stream_id for a in self.assignments if a.to_node_id == node_id
                    ),
                }
            )
        return out

    def print_sections(self, *, now_ms: int, out: TextIO | None = None) -> None:
        """The takeovers and pending reassignments, each under its heading (``none`` when empty)."""
        out = out or sys.stdout
        in_flight = [t for t in self.takeovers if t.state in IN_FLIGHT]
        last_done: dict[int, TakeoverInfo] = {}
        for t in sorted(self.takeovers, key=lambda t: t.created_at_ms):
            if t.state == TakeoverState.DONE:
                last_done[t.node_id] = t
        shown = sorted(
            [*in_flight, *last_done.values()], key=lambda t: (t.state != TakeoverState.DONE, t.node_id)
        )
        out.write(f"\ntakeovers ({len(in_flight)} in flight)\n")
        if shown:
            rows = [
                {**takeover_row(t, now_ms), "streams": stream_ids_cell([s for s, _ in t.streams])}
                for t in shown
            ]
            print_rows(rows, TAKEOVER_COLUMNS, as_json=False, out=out)
        else:
            out.write("none\n")
        out.write(f"\nreassignments pending ({len(self.assignments)})\n")
        if self.assignments:
            rows = [
                {
                    "stream_id": a.stream_id,
                    "from_node": None if a.from_node_id < 0 else a.from_node_id,
                    "to_node": a.to_node_id,
                    "age_ms": max(0, now_ms - a.requested_at_ms),
                }
                for a in sorted(self.assignments, key=lambda a: a.stream_id)
            ]
            print_rows(rows, ASSIGNMENT_COLUMNS, as_json=False, out=out)
        else:
            out.write("none\n")
