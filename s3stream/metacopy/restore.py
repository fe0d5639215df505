"""Rebuild a metadata database from its copy in the bucket: the newest readable snapshot, then the log
objects after it, in sequence order.

Restore stops at the first group it cannot read (a missing sequence number, or an object that fails
its checks where no other log object holds the same groups) and says so: the result is the metadata
as of the last group before that point, never a state with a hole in it. A damaged snapshot is
skipped for the one before it. The database is written beside the target under a temporary name and
renamed into place once complete, so a failed restore leaves no ``metadata.db``; a directory that
holds anything already is refused (restore never overwrites).

The restored database has no copy state: the data dir's first open starts a new copy (a new copy
id, a snapshot first) and leaves the one it was restored from untouched.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from s3stream.errors import (
    ConflictError,
    CorruptionError,
    InvalidArgumentError,
    NotFoundError,
    UnavailableError,
)
from s3stream.metacopy.objects import CopyKey, copies_prefix, decode_log, decode_snapshot, parse_copy_key
from s3stream.metadata import cluster_schema, sql_apply, sqlite_copy
from s3stream.metadata import sqlite_schema as schema
from s3stream.metadata.changelog import Group, decode_group
from s3stream.storage.base import ObjectStorage

METADATA_FILE = "metadata.db"
_TEMP_SUFFIX = ".restore~"


@dataclass(frozen=True, slots=True)
class RestoreReport:
    """What :func:`restore` rebuilt, and where it stopped."""

    database: str
    copy_id: str
    snapshot_key: str
    snapshot_seq: int
    last_seq: int
    """The last group commit restored: everything up to it is in the database."""
    last_commit_ms: int
    """Its wall-clock commit time (-1: unknown, no group since the copy began)."""
    log_objects_applied: int
    stopped: str | None
    """Why restore ended before the newest log object of the copy (None: it reached the end)."""
    streams: int
    committed_objects: int
    kv_pairs: int
    skipped: tuple[str, ...] = ()
    """Objects that failed their checks (a damaged snapshot, a damaged duplicate log object)."""
    other_copies: tuple[str, ...] = field(default=())
    """Other copy ids found under the namespace (restore with ``copy_id`` to pick one of them)."""


async def restore(
    storage: ObjectStorage,
    *,
    namespace: str,
    data_dir: str | os.PathLike[str],
    copy_id: str | None = None,
    kv_overrides: Mapping[str, bytes] | None = None,
) -> RestoreReport:
    """Write ``<data_dir>/metadata.db`` from the copy ``copy_id`` (default: the copy written last) of
    ``namespace`` in ``storage``; ``kv_overrides`` are KV pairs set in it (the storage record).

    ConflictError when ``data_dir`` holds anything; NotFoundError when there is no copy (or not the
    one named); CorruptionError when no snapshot of the copy is readable.
    """
    root = Path(data_dir)
    created = await asyncio.to_thread(_claim_directory, root)
    target = root / METADATA_FILE
    temp = root / (METADATA_FILE + _TEMP_SUFFIX)
    try:
        report = await _restore_into(storage, namespace, str(target), str(temp), copy_id, kv_overrides or {})
    except BaseException:
        await asyncio.to_thread(_remove, temp, root if created else None)
        raise
    return report


async def _restore_into(
    storage: ObjectStorage,
    namespace: str,
    target: str,
    temp: str,
    copy_id: str | None,
    kv_overrides: Mapping[str, bytes],
) -> RestoreReport:
    copies: dict[str, list[tuple[str, CopyKey, float]]] = {}
    async for info in storage.list(copies_prefix(namespace)):
        parsed = parse_copy_key(namespace, info.key)
        if parsed is not None:
            copies.setdefault(parsed.copy_id, []).append((info.key, parsed, info.last_modified_s))
    if not copies:
        raise NotFoundError(
            f"no metadata copy of namespace {namespace!r} in {storage!r} (under {copies_prefix(namespace)})"
        )
    if copy_id is None:
        copy_id = max(copies, key=lambda c: max(modified for _, _, modified in copies[c]))
    elif copy_id not in copies:
        raise NotFoundError(
            f"no metadata copy {copy_id!r} of namespace {namespace!r}; found {sorted(copies)}"
        )
    objects = copies[copy_id]
    snapshots = sorted(((p.last_seq, k) for k, p, _ in objects if p.kind == "snapshot"), reverse=True)
    logs = sorted((p.first_seq, p.last_seq, k) for k, p, _ in objects if p.kind == "log")
    skipped: list[str] = []

    base: tuple[str, int, int] | None = None
    for seq, key in snapshots:
        try:
            found_seq, database = decode_snapshot(await storage.get(key), source=key)
            if found_seq != seq:
                raise CorruptionError(f"holds group {found_seq}, its key says {seq}", source=key)
            last_commit_ms = await asyncio.to_thread(_write_snapshot, temp, bytes(database), seq, key)
        except (CorruptionError, NotFoundError) as exc:
            skipped.append(f"{key}: {exc}")
            continue
        base = (key, seq, last_commit_ms)
        break
    if base is None:
        raise CorruptionError(
            f"metadata copy {copy_id} has no readable snapshot ({'; '.join(skipped) or 'none uploaded yet'})",
            source=copies_prefix(namespace) + copy_id,
        )
    snapshot_key, snapshot_seq, last_commit_ms = base

    groups: list[Group] = []
    expected, applied_objects, stopped = snapshot_seq + 1, 0, None
    while True:
        covering = sorted(
            ((last, key) for first, last, key in logs if first <= expected <= last), reverse=True
        )
        if not covering:
            later = [key for first, _, key in logs if first > expected]
            if later:
                stopped = f"group {expected} is in no log object (the next one, {later[0]}, starts after it)"
            break
        for last, key in covering:
            try:
                entries = decode_log(await storage.get(key), source=key)
                decoded = [decode_group(g, source=f"{key} group {s}") for s, g in entries if s >= expected]
            except (CorruptionError, NotFoundError) as exc:
                skipped.append(f"{key}: {exc}")
                continue
            groups += decoded
            expected, applied_objects = last + 1, applied_objects + 1
            break
        else:
            stopped = f"group {expected} is only in damaged log objects ({', '.join(k for _, k in covering)})"
            break
    if groups:
        last_commit_ms = groups[-1].committed_at_ms
    counts = await asyncio.to_thread(_finish, temp, target, groups, kv_overrides)
    return RestoreReport(
        database=target,
        copy_id=copy_id,
        snapshot_key=snapshot_key,
        snapshot_seq=snapshot_seq,
        last_seq=expected - 1,
        last_commit_ms=last_commit_ms,
        log_objects_applied=applied_objects,
        stopped=stopped,
        streams=counts[0],
        committed_objects=counts[1],
        kv_pairs=counts[2],
        skipped=tuple(skipped),
        other_copies=tuple(sorted(c for c in copies if c != copy_id)),
    )


def _claim_directory(root: Path) -> bool:
    """Make sure ``root`` is a new or empty directory; returns whether this created it."""
    try:
        if root.exists():
            if not root.is_dir():
                raise ConflictError(f"{str(root)!r} exists and is not a directory")
            entries = sorted(os.listdir(root))
            if entries:
                raise ConflictError(
                    f"{str(root)!r} is not empty (holds {', '.join(entries[:5])}): restore writes a new data dir "
                    "and never overwrites one; give a new or empty directory"
                )
            return False
        root.mkdir(parents=True)
    except (OSError, ValueError) as exc:
        raise InvalidArgumentError(f"cannot use {str(root)!r} as the new data dir: {exc}") from exc
    return True


def _remove(temp: Path, root: Path | None) -> None:
    for path in (temp, Path(f"{temp}-journal")):
        with contextlib.suppress(OSError):
            path.unlink()
    if root is not None:
        with contextlib.suppress(OSError):
            root.rmdir()


def _write_snapshot(temp: str, database: bytes, seq: int, key: str) -> int:
    """Write the snapshot's database to ``temp`` and check it; returns its last commit time."""
    with open(temp, "wb") as out:
        out.write(database)
    try:
        conn = sqlite3.connect(temp, isolation_level=None)
        try:
            rows = conn.execute("PRAGMA quick_check").fetchall()
            if rows != [("ok",)]:
                raise CorruptionError(f"the snapshot's database fails quick_check: {rows[:3]}", source=key)
            state = sqlite_copy.state(conn)
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise CorruptionError(f"the snapshot is not a readable database: {exc}", source=key) from exc
    if state is None or state.next_seq - 1 != seq:
        raise CorruptionError(f"the snapshot's database does not hold group {seq} last", source=key)
    return state.last_commit_ms


def _finish(
    temp: str, target: str, groups: list[Group], kv_overrides: Mapping[str, bytes]
) -> tuple[int, int, int]:
    """Apply ``groups`` and the KV overrides in one transaction, drop the copy state, and rename the
    database into place; returns the counts of streams, committed objects and KV pairs."""
    conn = sqlite3.connect(temp, isolation_level=None)
    try:
        schema.migrate(conn)  # a snapshot of an older schema version
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("BEGIN IMMEDIATE")
        try:
            for group in groups:
                sql_apply.apply(conn, group.changes)
            sqlite_copy.forget_copy(conn)
            cluster_schema.forget_cluster_state(conn)
            conn.executemany(
                "INSERT INTO kv (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                list(kv_overrides.items()),
            )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        counts = conn.execute(
            "SELECT (SELECT count(*) FROM streams), (SELECT count(*) FROM objects WHERE state = 2), "
            "(SELECT count(*) FROM kv)"
        ).fetchone()
    except sqlite3.IntegrityError as exc:
        raise CorruptionError(f"the copy's log does not fit its snapshot: {exc}", source=temp) from exc
    except sqlite3.Error as exc:
        raise UnavailableError(f"writing the restored metadata database failed: {exc}") from exc
    finally:
        conn.close()
    with open(temp, "rb+") as f:
        os.fsync(f.fileno())
    if os.path.exists(target):  # pragma: no cover - the directory was empty when claimed
        raise ConflictError(f"{target!r} appeared while restoring: not overwritten")
    os.rename(temp, target)
    directory = os.open(os.path.dirname(target), os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    return int(counts[0]), int(counts[1]), int(counts[2])
