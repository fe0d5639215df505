"""SIGKILL a node in the middle of wide commits and stream reopens; each commit is all or nothing.

A child process (:mod:`tests.crash.metadata_commit_child`) commits StreamSet objects that extend every
one of 1,000 streams (1,000 ranges per commit) and closes and reopens streams at newer epochs, on a
SQLite file or a PostgreSQL schema (the same test for both metadata URLs). The parent kills it with
SIGKILL at a random moment, mostly while a commit or a reopen is in flight (it waits for the child's
``COMMIT`` or ``REOPEN`` line, then a random fraction of a commit's measured duration).

After each kill the store opens and shows: every stream at the same end offset ``k * STEP`` with
exactly ``k`` COMMITTED StreamSet objects of 1,000 ranges each, the i-th covering
``[i * STEP, (i + 1) * STEP)`` of every stream (a commit landed entirely or not at all); ``k`` is the
acknowledged commits or one more; the in-flight object is COMMITTED or still PREPARED, nothing else;
object ids never repeat across incarnations; each stream's ranges are contiguous with strictly
rising epochs, and ``get_objects`` covers it from 0 to its end. Then the next child (a newer node
epoch) continues on the same store; a last child runs to completion, and then a commit or a close
with a killed child's node epoch is refused (NODE_EPOCH_EXPIRED) and changes nothing.

PostgreSQL finishes a transaction whose COMMIT it received even after its client died, so the
store may change for a moment after the kill: each child connects under its own
``application_name`` and the parent checks only once the server has no session of that name left.

``S3STREAM_METADATA_COMMIT_CRASH_KILLS`` sets the kills per metadata kind (CI: 5).
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import subprocess
import sys
import time
import urllib.parse
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest

from s3stream.errors import ErrorCode, FencedError
from s3stream.ids import StreamId
from s3stream.metadata.base import (
    CommitStreamSetObjectRequest,
    ObjectKind,
    ObjectState,
    StreamOffsetRange,
    StreamState,
)
from tests.crash.backend import iterations
from tests.crash.metadata_commit_child import NODE, STEP, STREAM_COUNT, setup
from tests.support.metadata_urls import METADATA_KINDS, MetadataKind, metadata_url, open_store

pytestmark = pytest.mark.crash
KILLS = iterations("S3STREAM_METADATA_COMMIT_CRASH_KILLS", 5)
REPO = Path(__file__).resolve().parents[2]
CHILD_TIMEOUT_S = 120.0
SESSION_END_TIMEOUT_S = 30.0


@dataclass
class History:
    """What the children said across incarnations."""

    commits: int = 0
    """COMMITTED StreamSet objects found by the last check."""
    prepared_ids: set[int] = field(default_factory=set)
    epochs: dict[int, int] = field(default_factory=dict)
    """Stream epochs found by the last check."""
    in_flight_kills: int = 0
    landed_in_flight: int = 0
    commit_s: float = 0.05
    """How long the last commit the parent saw took (from its ``COMMIT`` line to its ``ACK``)."""


@dataclass
class Run:
    """One child's output: acknowledged commits, what was in flight when it died."""

    acks: list[int]
    committing: int | None
    """The object of a ``COMMIT`` line without its ``ACK``."""
    reopening: tuple[int, int] | None
    """(stream, epoch) of a ``REOPEN`` line without its ``OPENED``."""
    commit_ids: list[int]
    opened: dict[int, int]
    """Stream -> the epoch of its last ``OPENED`` line."""


def parse(lines: list[str]) -> Run:
    acks: list[int] = []
    commit_ids: list[int] = []
    committing: int | None = None
    reopening: tuple[int, int] | None = None
    opened: dict[int, int] = {}
    for line in lines:
        word, *args = line.split()
        if word == "COMMIT":
            committing = int(args[0])
            commit_ids.append(committing)
        elif word == "ACK":
            assert committing == int(args[0]), lines
            acks.append(committing)
            committing = None
        elif word == "REOPEN":
            reopening = (int(args[0]), int(args[1]))
        elif word == "OPENED":
            assert reopening == (int(args[0]), int(args[1])), lines
            opened[reopening[0]] = reopening[1]
            reopening = None
    return Run(acks, committing, reopening, commit_ids, opened)


def with_application_name(url: str, name: str) -> str:
    """A ``postgresql`` URL whose sessions carry ``name`` (a ``sqlite`` URL unchanged)."""
    if not url.startswith("postgresql"):
        return url
    parts = urllib.parse.urlsplit(url)
    query = [*urllib.parse.parse_qsl(parts.query), ("application_name", name)]
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))


def wait_until_sessions_end(url: str, name: str) -> None:
    """Until the server of a ``postgresql`` URL has no session named ``name`` (its transactions
    finished: committed or rolled back); at once for a ``sqlite`` URL."""
    if not url.startswith("postgresql"):
        return
    deadline = time.monotonic() + SESSION_END_TIMEOUT_S
    with psycopg.connect(url, autocommit=True) as conn:
        while True:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (name,)
            ).fetchone()
            if row is not None and row[0] == 0:
                return
            assert time.monotonic() < deadline, f"sessions of the killed child {name} still open: {row}"
            time.sleep(0.01)


def start_child(url: str, node_epoch: int, rounds: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.crash.metadata_commit_child", url, str(node_epoch), str(rounds)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def kill_mid_operation(proc: subprocess.Popen[str], rng: random.Random, history: History) -> list[str]:
    """Read the child's lines; after a random ``COMMIT`` or ``REOPEN`` line, wait a random part of a
    commit's duration, SIGKILL it; returns every line it printed."""
    assert proc.stdout is not None
    lines: list[str] = []
    first = history.in_flight_kills == 0  # until one kill hit a commit, aim early inside one
    target_word = "COMMIT" if first else rng.choice(["COMMIT", "COMMIT", "COMMIT", "REOPEN"])
    target_count = rng.randint(1, 3)
    committed_at = 0.0
    seen = 0
    for raw in proc.stdout:
        line = raw.strip()
        lines.append(line)
        now = time.monotonic()
        if line.startswith("COMMIT"):
            committed_at = now
        elif line.startswith("ACK"):
            history.commit_s = max(0.001, now - committed_at)
        if line.startswith(target_word):
            seen += 1
            if seen == target_count:
                # early, anywhere in the commit, or near its end (where it may land unacknowledged)
                fraction = (
                    rng.uniform(0, 0.3) if first else rng.choice([rng.uniform(0, 1.2), rng.uniform(0.8, 1.2)])
                )
                time.sleep(history.commit_s * fraction)
                break
    proc.send_signal(signal.SIGKILL)
    # Read the rest through the same file object: lines it already buffered are not in the pipe
    # any more, so ``communicate`` (which reads the pipe itself) would lose them.
    lines += [line for line in (raw.strip() for raw in proc.stdout) if line]
    proc.wait(timeout=CHILD_TIMEOUT_S)
    assert proc.stderr is not None
    err = proc.stderr.read()
    assert proc.returncode == -signal.SIGKILL, f"child exited {proc.returncode}: {err[-3000:]}"
    assert "READY" in lines, err[-3000:]
    return lines


async def check(url: str, history: History, run: Run) -> None:
    """The store's state after ``run``; updates ``history``."""
    store = await open_store(url)
    try:
        streams = {s.stream_id: s for s in await store.list_streams()}
        assert sorted(streams) == list(range(STREAM_COUNT))
        ends = {s.end_offset for s in streams.values()}
        assert len(ends) == 1, f"streams at different end offsets (a torn commit): {sorted(ends)[:10]}"
        (end,) = ends
        assert end % STEP == 0, end
        commits = end // STEP
        low = history.commits + len(run.acks)
        assert low <= commits <= low + (run.committing is not None), (history.commits, run, commits)

        ssos = await store.get_stream_set_objects(NODE)
        assert len(ssos) == commits, (len(ssos), commits)
        for index, sso in enumerate(ssos):
            assert len(sso.ranges) == STREAM_COUNT, (sso.object_id, len(sso.ranges))
            spans = {(r.start_offset, r.end_offset) for r in sso.ranges}
            assert spans == {(index * STEP, (index + 1) * STEP)}, (sso.object_id, sorted(spans)[:5])
            assert [r.stream_id for r in sso.ranges] == list(range(STREAM_COUNT))
        committed = await store.list_objects([ObjectState.COMMITTED])
        assert {o.object_id for o in committed} == {s.object_id for s in ssos}
        assert all(o.kind == ObjectKind.STREAM_SET for o in committed)
        assert set(run.acks) <= {s.object_id for s in ssos}

        everything = await store.list_objects()
        assert len({o.object_id for o in everything}) == len(everything)
        fresh = set(run.commit_ids)
        assert not fresh & history.prepared_ids, (
            f"object ids handed out twice: {fresh & history.prepared_ids}"
        )
        history.prepared_ids |= fresh
        if run.committing is not None:
            history.in_flight_kills += 1
            state = (await store.get_object(run.committing)).state  # type: ignore[arg-type]
            landed = state == ObjectState.COMMITTED
            assert landed or state == ObjectState.PREPARED, state
            assert landed == (commits == low + 1)
            history.landed_in_flight += landed

        for sid, stream in streams.items():
            ranges = stream.ranges
            assert ranges, stream
            assert all(a.end_offset == b.start_offset for a, b in itertools.pairwise(ranges)), stream
            assert all(a.epoch < b.epoch for a, b in itertools.pairwise(ranges)), stream
            assert (ranges[-1].epoch, ranges[-1].node_id, ranges[-1].end_offset) == (stream.epoch, NODE, end)
            assert ranges[0].start_offset <= stream.start_offset
            expected = run.opened.get(sid, history.epochs.get(sid, 0))
            if run.reopening is not None and run.reopening[0] == sid:  # killed before, in or after it
                assert stream.epoch in (run.reopening[1] - 1, run.reopening[1]), (run.reopening, stream)
                assert stream.state == StreamState.OPENED or stream.epoch == run.reopening[1] - 1
            else:
                assert (stream.epoch, stream.state) == (expected, StreamState.OPENED), (expected, stream)
            history.epochs[sid] = stream.epoch
            if end:
                slices = await store.get_objects(
                    stream_id=StreamId(sid), start_offset=0, end_offset=-1, limit=100_000
                )
                assert [(s.start_offset, s.end_offset) for s in slices] == [
                    (i * STEP, (i + 1) * STEP) for i in range(commits)
                ]
        history.commits = commits
    finally:
        await store.close()


async def check_killed_incarnations_are_fenced(url: str, *, node_epoch: int) -> None:
    """A commit or an open with a killed child's node epoch is refused and writes nothing."""
    store = await open_store(url)
    try:
        stream = await store.describe_stream(StreamId(0))
        object_id = await store.prepare_objects(count=1, ttl_ms=60_000)
        request = CommitStreamSetObjectRequest(
            node_id=NODE,
            node_epoch=node_epoch,
            object_id=object_id,
            order_id=object_id,
            object_size_bytes=STEP,
            stream_ranges=(
                StreamOffsetRange(stream.stream_id, stream.end_offset, stream.end_offset + STEP, STEP),
            ),
        )
        with pytest.raises(FencedError) as refused:
            await store.commit_stream_set_object(request)
        assert refused.value.code == ErrorCode.NODE_EPOCH_EXPIRED
        with pytest.raises(FencedError):
            await store.close_stream(
                node_id=NODE, node_epoch=node_epoch, stream_id=stream.stream_id, epoch=stream.epoch
            )
        assert (await store.get_object(object_id)).state == ObjectState.PREPARED
        assert await store.describe_stream(StreamId(0)) == stream
    finally:
        await store.close()


@pytest.mark.parametrize("kind", METADATA_KINDS)
async def test_sigkill_mid_commit_leaves_every_commit_whole(
    kind: MetadataKind, tmp_path: Path, rng_seed: int
) -> None:
    rng = random.Random(rng_seed)
    with metadata_url(kind, tmp_path) as url:
        await setup(url)
        history = History()
        for kill in range(KILLS):
            name = f"s3stream-crash-child-{uuid.uuid4().hex[:12]}"
            child = start_child(with_application_name(url, name), node_epoch=2 + kill, rounds=0)
            lines = kill_mid_operation(child, rng, history)
            wait_until_sessions_end(url, name)
            await check(url, history, parse(lines))
        proc = start_child(url, node_epoch=2 + KILLS, rounds=3)
        out, err = proc.communicate(timeout=CHILD_TIMEOUT_S)
        assert proc.returncode == 0, err[-3000:]
        last = parse(out.splitlines())
        assert (len(last.acks), last.committing, last.reopening) == (3, None, None)
        await check(url, history, last)
        await check_killed_incarnations_are_fenced(url, node_epoch=1 + KILLS)
    print(
        f"{kind}: {history.commits} commits of {STREAM_COUNT} ranges over {KILLS} kills; "
        f"{history.in_flight_kills} kills with a commit in flight, {history.landed_in_flight} of them landed"
    )
    assert history.in_flight_kills > 0 or KILLS < 2
