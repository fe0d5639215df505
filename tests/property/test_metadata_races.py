"""Four node processes commit, open, close and fence the same streams on one metadata store at once.

Hypothesis writes one operation script per node (:mod:`tests.property.metadata_race_worker` says
what each operation does); four long-lived worker processes run their scripts concurrently against a
fresh store (a PostgreSQL schema, or a SQLite file shared by the processes) and log every store
call with its monotonic start and end time. The interleaving is whatever the machine produces; the
scripts decide which races are possible (stale end offsets, takeovers in the middle of a commit,
fences of a node that is committing, a node rejoining while it is fenced).

Then the history and the final state must satisfy:

- all or nothing: an acknowledged commit's object is COMMITTED with exactly its ranges; a refused
  one is still PREPARED (a call that ended ``unknown`` may be either);
- no lost update: each stream's landed commits tile ``[0, end_offset)`` with no gap or overlap, and
  ``get_objects`` returns exactly them;
- every fence holds: a landed commit lies inside a range the committing node owned; no call with a
  node epoch succeeds after a newer registration of that node was acknowledged; a commit that started
  after another node's open was acknowledged succeeded only if its node opened the stream again
  later; no close at an epoch succeeds after an open at a newer one was acknowledged; acknowledged
  opens of a stream have distinct epochs, in real-time order, and the last is the stream's epoch;
- object ids are never handed out twice;
- KV is one register per key for every node: a read returns the latest value as of some moment
  within the read (a value whose put started before the read ended and was not overwritten by a
  put that ran wholly between them).

``S3STREAM_METADATA_RACE_EXAMPLES`` sets the hypothesis examples per store (CI: 10).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from s3stream.ids import NodeId, ObjectId, StreamId
from s3stream.metadata.base import MetadataStore, ObjectState, StreamMetadata
from tests.support.metadata_urls import (
    METADATA_KINDS,
    MetadataKind,
    metadata_url,
    open_store,
)
from tests.support.postgres import pg_server_url

NODE_COUNT = 4
STREAM_COUNT = 4
KEY_COUNT = 2
EXAMPLES = int(os.environ.get("S3STREAM_METADATA_RACE_EXAMPLES", "10"))
REPO = Path(__file__).resolve().parents[2]
JOB_TIMEOUT_S = 120.0
START_DELAY_S = 0.5
"""How far ahead of sending the jobs the workers are told to start: time to open the store."""

Entry = dict[str, Any]

STREAM_INDEX = st.integers(min_value=0, max_value=STREAM_COUNT - 1)
DELAY_MS = st.integers(min_value=0, max_value=3)
COMMIT = st.tuples(
    st.just("commit"),
    st.lists(STREAM_INDEX, min_size=1, max_size=STREAM_COUNT, unique=True).map(sorted),
    st.integers(min_value=1, max_value=5),
    DELAY_MS,
)
OPEN = st.tuples(st.just("open"), STREAM_INDEX, DELAY_MS)
OPERATION = st.one_of(
    COMMIT,
    COMMIT,
    COMMIT,
    OPEN,
    OPEN,
    st.tuples(st.just("close"), STREAM_INDEX, DELAY_MS),
    st.tuples(st.just("fence"), st.integers(min_value=1, max_value=NODE_COUNT), DELAY_MS),
    st.tuples(st.just("rejoin"), DELAY_MS),
    st.tuples(
        st.sampled_from(["kv_put", "kv_get"]), st.integers(min_value=0, max_value=KEY_COUNT - 1), DELAY_MS
    ),
)
SCRIPTS = st.lists(st.lists(OPERATION, min_size=3, max_size=20), min_size=NODE_COUNT, max_size=NODE_COUNT)


class Workers:
    """The node processes (node ids 1..NODE_COUNT), started once per test and fed one job per example.
    Their stderr goes to files under ``log_dir`` (a pipe nobody reads could fill and stall them)."""

    def __init__(self, log_dir: Path) -> None:
        self.stderr_paths = [log_dir / f"worker-{node}.stderr" for node in range(1, NODE_COUNT + 1)]
        self.procs: list[subprocess.Popen[str]] = []
        for node, path in enumerate(self.stderr_paths, start=1):
            with path.open("w") as stderr:
                self.procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "tests.property.metadata_race_worker", str(node)],
                        cwd=REPO,
                        env={**os.environ, "PYTHONPATH": str(REPO)},
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        stderr=stderr,
                        text=True,
                    )
                )
        for proc in self.procs:
            assert proc.stdout is not None
            line = proc.stdout.readline().strip()
            assert line == "READY", self.stderr(proc)

    def stderr(self, proc: subprocess.Popen[str]) -> str:
        return self.stderr_paths[self.procs.index(proc)].read_text()[-3000:]

    def run(self, url: str, streams: list[int], scripts: list[list[Any]]) -> list[Entry]:
        start_at = time.monotonic() + START_DELAY_S
        for proc, ops in zip(self.procs, scripts, strict=True):
            job = {"url": url, "start_at": start_at, "node_epoch": 1, "streams": streams, "ops": ops}
            assert proc.stdin is not None
            proc.stdin.write(json.dumps(job) + "\n")
            proc.stdin.flush()
        entries: list[Entry] = []
        deadline = time.monotonic() + JOB_TIMEOUT_S
        for proc in self.procs:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line, f"worker died: {self.stderr(proc)}"
            assert time.monotonic() < deadline, "the workers took too long"
            answer = json.loads(line)
            assert "error" not in answer, answer["error"]
            entries += answer["log"]
        return entries

    def close(self) -> None:
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.write("\n")
            proc.stdin.flush()
        for proc in self.procs:
            proc.wait(timeout=30)


@contextmanager
def workers(log_dir: Path) -> Iterator[Workers]:
    running = Workers(log_dir)
    try:
        yield running
    finally:
        try:
            running.close()
        finally:
            for proc in running.procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()


async def setup(url: str) -> tuple[list[int], list[Entry]]:
    """Register every node (node epoch 1) and open stream ``i`` by node ``i % NODE_COUNT + 1``; returns
    the stream ids and the opens as log entries (done before any worker starts)."""
    store = await open_store(url)
    try:
        for node in range(1, NODE_COUNT + 1):
            await store.register_node(node_id=NodeId(node), node_epoch=1)
        streams: list[int] = []
        opens: list[Entry] = []
        for index in range(STREAM_COUNT):
            node = NodeId(index % NODE_COUNT + 1)
            sid = await store.create_stream(node_id=node, node_epoch=1)
            await store.open_stream(node_id=node, node_epoch=1, stream_id=sid, epoch=0)
            streams.append(sid)
            t = time.monotonic()
            opens.append(
                {"node": node, "op": "open", "stream": sid, "epoch": 0, "node_epoch": 1, "t0": t, "t1": t}
                | {"result": "ok", "code": "NONE"}
            )
        return streams, opens
    finally:
        await store.close()


async def final_state(url: str, streams: list[int]) -> dict[str, Any]:
    store: MetadataStore = await open_store(url)
    try:
        described = {sid: await store.describe_stream(StreamId(sid)) for sid in streams}
        slices = {
            sid: [
                (s.object_id, s.start_offset, s.end_offset)
                for s in await store.get_objects(
                    stream_id=StreamId(sid), start_offset=0, end_offset=-1, limit=10_000
                )
            ]
            if described[sid].end_offset
            else []
            for sid in streams
        }
        ssos = {
            sso.object_id: (sso.node_id, [[r.stream_id, r.start_offset, r.end_offset] for r in sso.ranges])
            for node in range(1, NODE_COUNT + 1)
            for sso in await store.get_stream_set_objects(NodeId(node))
        }
        objects = {o.object_id: o.state for o in await store.list_objects()}
        return {"streams": described, "slices": slices, "ssos": ssos, "objects": objects}
    finally:
        await store.close()


def check_history(entries: list[Entry], state: dict[str, Any]) -> None:
    """The invariants of the module docstring over the call log and the final state."""
    ok = [e for e in entries if e["result"] == "ok"]
    prepared = [e["value"] for e in ok if e["op"] == "prepare"]
    assert len(prepared) == len(set(prepared)), (
        f"object ids handed out twice: {Counter(prepared).most_common(3)}"
    )
    landed = landed_commits(entries, state)
    for sid, stream in state["streams"].items():
        check_stream_data(stream, landed, state["slices"][sid])
        check_stream_fences(stream, entries, landed)
    check_node_fences(ok)
    check_kv_reads(entries)


def landed_commits(entries: list[Entry], state: dict[str, Any]) -> list[Entry]:
    """The commits that took effect, each whole; refused ones left their object PREPARED."""
    objects: dict[ObjectId, ObjectState] = state["objects"]
    ssos: dict[ObjectId, tuple[NodeId, list[list[int]]]] = state["ssos"]
    landed: list[Entry] = []
    for commit in (e for e in entries if e["op"] == "commit"):
        object_id = commit["object_id"]
        if commit["result"] == "ok" or (
            commit["result"] == "unknown" and objects.get(object_id) == ObjectState.COMMITTED
        ):
            assert objects.get(object_id) == ObjectState.COMMITTED, commit
            assert ssos[object_id] == (commit["node"], commit["ranges"]), (commit, ssos.get(object_id))
            landed.append(commit)
        elif commit["result"] != "unknown":
            assert objects.get(object_id) == ObjectState.PREPARED, ("a refused commit left a trace", commit)
    assert set(ssos) == {c["object_id"] for c in landed}, "StreamSet objects nobody committed"
    return landed


def check_stream_data(
    stream: StreamMetadata, landed: list[Entry], slices: list[tuple[int, int, int]]
) -> None:
    """The landed commits tile ``[0, end_offset)``, each inside a range of its node; ``get_objects``
    returns exactly them; the ranges are contiguous with rising epochs."""
    sid = stream.stream_id
    mine = sorted(
        (start, end, c["object_id"], c["node"]) for c in landed for s, start, end in c["ranges"] if s == sid
    )
    position = 0
    for start, end, _object_id, node in mine:
        assert start == position, f"stream {sid}: a gap or overlap at {position}: {mine}"
        position = end
        assert any(
            r.node_id == node and r.start_offset <= start and end <= r.end_offset for r in stream.ranges
        ), f"stream {sid}: node {node} committed [{start}, {end}) outside its ranges {stream.ranges}"
    assert stream.end_offset == position, (sid, stream.end_offset, mine)
    assert slices == [(object_id, start, end) for start, end, object_id, _ in mine]
    assert all(a.epoch < b.epoch for a, b in itertools.pairwise(stream.ranges)), stream
    assert all(a.end_offset == b.start_offset for a, b in itertools.pairwise(stream.ranges)), stream


def check_stream_fences(stream: StreamMetadata, entries: list[Entry], landed: list[Entry]) -> None:
    """Opens get distinct epochs in real-time order, the last is the stream's; no commit or close by
    an owner succeeds after another node's open of the stream was acknowledged."""
    sid = stream.stream_id
    calls = [e for e in entries if e.get("stream") == sid]
    opens = [e for e in calls if e["op"] == "open" and e["result"] == "ok"]
    epochs = [o["epoch"] for o in opens]
    assert len(epochs) == len(set(epochs)), f"stream {sid} opened twice at one epoch: {opens}"
    unknown = {e["epoch"] for e in calls if e["op"] == "open" and e["result"] == "unknown"}
    assert stream.epoch == max(epochs) or stream.epoch in unknown, (stream, opens)
    for a, b in itertools.permutations(opens, 2):
        if a["t1"] < b["t0"]:
            assert a["epoch"] < b["epoch"], f"stream {sid}: open {b} after {a} got an older epoch"
    for close in (e for e in calls if e["op"] == "close" and e["result"] == "ok"):
        fenced_by = [o for o in opens if o["epoch"] > close["epoch"] and o["t1"] < close["t0"]]
        assert not fenced_by, f"stream {sid}: {close} succeeded after {fenced_by[0]}"
    for commit in (c for c in landed if c["result"] == "ok" and any(s == sid for s, _, _ in c["ranges"])):
        last = max((o for o in opens if o["t1"] < commit["t0"]), key=lambda o: o["epoch"])
        if last["node"] != commit["node"]:
            assert any(
                o["node"] == commit["node"] and o["epoch"] > last["epoch"] and o["t0"] < commit["t1"]
                for o in opens
            ), f"stream {sid}: {commit} succeeded after {last} fenced its node"


def check_node_fences(ok: list[Entry]) -> None:
    """No call with a node epoch succeeds after a newer registration of that node was acknowledged."""
    registers = [r for r in ok if r["op"] == "register"]
    for call in (c for c in ok if "node_epoch" in c):
        acting = call.get("as_node", call["node"])
        for register in registers:
            if register["target"] == acting and register["epoch"] > call["node_epoch"]:
                assert not register["t1"] < call["t0"], (
                    f"{call} succeeded after {register} fenced its node epoch"
                )


def check_kv_reads(entries: list[Entry]) -> None:
    """Each KV read returns the latest value as of some moment within the read: a value whose put
    started before the read ended, not overwritten by a put acknowledged wholly between the two
    (every put writes a value of its own); absent only if no put was acknowledged before the read
    began. A put that ended ``unknown`` may be the source of a read but overwrites nothing for sure."""
    puts = [e for e in entries if e["op"] == "kv_put" and e["result"] in ("ok", "unknown")]
    for get in (e for e in entries if e["op"] == "kv_get" and e["result"] == "ok"):
        acked = [p for p in puts if p["key"] == get["key"] and p["result"] == "ok"]
        if get["read"] is None:
            earlier = [p for p in acked if p["t1"] < get["t0"]]
            assert not earlier, f"{get} read nothing after {earlier[0]} was acknowledged"
            continue
        sources = [p for p in puts if p["key"] == get["key"] and p["written"] == get["read"]]
        assert len(sources) == 1, f"{get} read a value no put wrote: {sources}"
        source = sources[0]
        assert source["t0"] < get["t1"], f"{get} read {source} before it was sent"
        between = [p for p in acked if source["t1"] < p["t0"] and p["t1"] < get["t0"]]
        assert not between, f"{get} read {source}, overwritten by {between[0]} before the read began"


@pytest.mark.slow
@pytest.mark.parametrize("kind", METADATA_KINDS)
def test_concurrent_nodes_lose_no_update_and_every_fence_holds(kind: MetadataKind, tmp_path: Path) -> None:
    stats: Counter[str] = Counter()
    if kind == "postgresql":
        pg_server_url()  # fails at once without a server, before the workers start
    with workers(tmp_path) as running:

        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )
        @given(scripts=SCRIPTS)
        def example(scripts: list[list[Any]]) -> None:
            with metadata_url(kind, tmp_path) as url:
                streams, opens = asyncio.run(setup(url))
                entries = running.run(url, streams, [[list(op) for op in ops] for ops in scripts])
                check_history(opens + entries, asyncio.run(final_state(url, streams)))
            stats.update(f"{e['op']} {e['result']}" for e in entries)

        example()
    print(f"{kind}: {dict(sorted(stats.items()))}")
    assert stats["commit ok"] > 0
    assert stats["commit FencedError"] + stats["commit ConflictError"] > 0, "no race was exercised"


def test_the_checks_reject_stale_reads_and_calls_after_a_fence() -> None:
    def call(op: str, t0: float, t1: float, **details: Any) -> Entry:
        return {"node": 1, "op": op, "t0": t0, "t1": t1, "result": "ok", "code": "NONE", **details}

    put_a = call("kv_put", 0, 1, key="k", written="a")
    put_b = call("kv_put", 2, 3, key="k", written="b")
    check_kv_reads([put_a, put_b, call("kv_get", 2.5, 4, key="k", read="a")])  # overlaps put b: fine
    with pytest.raises(AssertionError, match="overwritten"):
        check_kv_reads([put_a, put_b, call("kv_get", 4, 5, key="k", read="a")])
    with pytest.raises(AssertionError, match="read nothing"):
        check_kv_reads([put_a, call("kv_get", 4, 5, key="k", read=None)])

    fence = call("register", 0, 1, target=2, epoch=7)
    check_node_fences([fence, call("commit", 0.5, 2, node_epoch=5) | {"node": 2}])  # overlaps: fine
    with pytest.raises(AssertionError, match="fenced its node epoch"):
        check_node_fences([fence, call("commit", 2, 3, node_epoch=5) | {"node": 2}])
