"""``s3stream nodes`` and the owner column of ``streams``, on a real SQLite metadata store that two
nodes registered in: node 1 alive (lease renewed now), node 2 expired (its lease ended 10 minutes ago).

Streams: 0 and 1 opened by node 1, 2 opened by node 2, 3 opened by node 1 then closed (not owned:
only OPENED streams count), 4 created and never opened (no range: no owner).
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from compaction.maintenance import MaintenanceElection
from s3stream import assembly
from s3stream.cli import main
from s3stream.cli.nodes import node_rows
from s3stream.clock import wall_clock_ms
from s3stream.config import Config
from s3stream.ids import NodeId, StreamId
from s3stream.metadata.base import RangeMetadata, StreamMetadata, StreamState
from s3stream.metadata.sqlite import SqliteMetadataStore
from tests.support.configs import SMALL_TOML

LEASE_MS = 60_000
PAST_MS = 10 * 60_000


async def two_nodes(path: Path) -> None:
    offset_ms = 0
    store = await SqliteMetadataStore.open(path, clock_ms=lambda: wall_clock_ms() - offset_ms)
    try:
        offset_ms = PAST_MS  # node 2 registered and was last heard of 10 minutes ago
        two = await store.open_node(node_id=NodeId(2), lease_ms=LEASE_MS)
        offset_ms = 0
        one = await store.open_node(node_id=NodeId(1), lease_ms=LEASE_MS)
        owners = [one, one, two, one]
        for node in [*owners, one]:
            await store.create_stream(node_id=node.node_id, node_epoch=node.node_epoch)
        for stream_id, node in enumerate(owners):
            await store.open_stream(
                node_id=node.node_id, node_epoch=node.node_epoch, stream_id=StreamId(stream_id), epoch=0
            )
        await store.close_stream(
            node_id=one.node_id, node_epoch=one.node_epoch, stream_id=StreamId(3), epoch=0
        )
    finally:
        await store.close()


@pytest.fixture
async def metadata_url(tmp_path: Path) -> str:
    db = tmp_path / "shared" / "metadata.db"
    db.parent.mkdir()
    await two_nodes(db)
    return f"sqlite://{db}"


def cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 0
    return capsys.readouterr().out


def test_nodes_lists_epoch_lease_state_age_and_streams_owned(
    metadata_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["nodes", "--data-dir", str(tmp_path / "none"), "--metadata-url", metadata_url]
    rows = json.loads(cli([*args, "--json"], capsys))
    assert [(r["node_id"], r["epoch"], r["lease"], r["streams_owned"]) for r in rows] == [
        (1, 1, "alive", 2),
        (2, 1, "expired", 1),
    ]
    one, two = rows
    assert 0 <= one["lease_age_ms"] < PAST_MS // 2
    assert PAST_MS <= two["lease_age_ms"] < PAST_MS * 2
    assert two["lease_expires_at_ms"] == two["heartbeat_at_ms"] + LEASE_MS

    assert [(r["streams"], r["wal_pending_bytes"], r["takeover"], r["assignments_to"]) for r in rows] == [
        ([0, 1], None, None, []),  # no heartbeat sent a WAL backlog: unknown
        ([2], None, None, []),
    ]

    text = cli(args, capsys).splitlines()
    assert text[0].split() == [
        "node_id",
        "epoch",
        "lease",
        "lease_age_ms",
        "streams_owned",
        "wal_pending_bytes",
        "streams",
    ]
    assert [line.split()[:3] + line.split()[4:] for line in text[1:3]] == [
        ["1", "1", "alive", "2", "-", "0,1"],
        ["2", "1", "expired", "1", "-", "2"],
    ]
    assert text[3:] == ["", "takeovers (0 in flight)", "none", "", "reassignments pending (0)", "none"]


def test_a_node_registered_without_a_lease_is_unleased(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async def legacy(path: Path) -> None:  # register_node: an epoch of its own, no lease
        store = await SqliteMetadataStore.open(path)
        try:
            await store.register_node(node_id=NodeId(7), node_epoch=5)
            await store.create_stream(node_id=NodeId(7), node_epoch=5)
            await store.open_stream(node_id=NodeId(7), node_epoch=5, stream_id=StreamId(0), epoch=0)
        finally:
            await store.close()

    db = tmp_path / "legacy.db"
    asyncio.run(legacy(db))
    rows = json.loads(cli(["nodes", "--metadata-url", f"sqlite://{db}", "--json"], capsys))
    assert [(r["node_id"], r["epoch"], r["lease"], r["streams_owned"]) for r in rows] == [
        (7, 5, "unleased", 1)
    ]


def test_streams_shows_each_streams_owner_node(
    metadata_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["streams", "--data-dir", str(tmp_path / "none"), "--metadata-url", metadata_url]
    rows = json.loads(cli([*args, "--json"], capsys))
    assert [(r["stream_id"], r["state"], r["owner"]) for r in rows] == [
        (0, "OPENED", 1),
        (1, "OPENED", 1),
        (2, "OPENED", 2),
        (3, "CLOSED", 1),
        (4, "CLOSED", None),
    ]
    text = cli(args, capsys).splitlines()
    header = text[0].split()
    owner = header.index("owner")
    assert [line.split()[owner] for line in text[1:]] == ["1", "1", "2", "1", "-"]


def test_an_owner_missing_from_the_nodes_is_listed_unregistered() -> None:
    owned = StreamMetadata(
        stream_id=StreamId(0),
        epoch=0,
        start_offset=0,
        end_offset=0,
        state=StreamState.OPENED,
        ranges=(RangeMetadata(StreamId(0), 0, 0, 0, 0, NodeId(9)),),
    )
    assert node_rows([], [owned], now_ms=0) == [
        {
            "node_id": 9,
            "epoch": None,
            "lease": "unregistered",
            "lease_age_ms": None,
            "streams_owned": 1,
            "lease_expires_at_ms": None,
            "heartbeat_at_ms": None,
            "registered_at_ms": None,
        }
    ]


async def test_compact_refuses_while_another_live_node_holds_the_maintenance_lease(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shared = f"sqlite://{tmp_path / 'shared.db'}"
    (tmp_path / "two").mkdir()  # node 2's data dir (compact opens an existing one)
    config = tmp_path / "s3stream.toml"
    config.write_text(SMALL_TOML)
    holder = await assembly.open_client(
        tmp_path / "one",
        config=Config.from_sources(config, metadata_url=shared, node_id=1, node_lease_ms=60_000),
    )
    try:
        election = holder.components["maintenance"]
        assert isinstance(election, MaintenanceElection)
        assert await election.elect_once()  # node 1 holds the lease (for a minute)
        argv = [
            "compact",
            "--data-dir",
            str(tmp_path / "two"),
            "--config",
            str(config),
            "--metadata-url",
            shared,
        ]
        env = {"S3STREAM_S3_NODE_ID": "2"}
        assert await asyncio.to_thread(run_with_env, argv, env) == 2
        err = capsys.readouterr().err
        assert err.startswith("s3stream compact: error: node 1 (epoch 1) holds the 'maintenance' lease")
        assert err.count("\n") == 1
    finally:
        await holder.close()  # releases the lease
    assert await asyncio.to_thread(run_with_env, argv, env) == 0


def run_with_env(argv: list[str], env: dict[str, str]) -> int:
    old = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        return main(argv)
    finally:
        for name, value in old.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value
