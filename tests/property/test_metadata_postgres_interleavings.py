"""Hypothesis-chosen scripts of three nodes run at once on one PostgreSQL schema, each node on its
own connection: whatever the interleaving, no update is lost, every fence holds, no id repeats
(the invariants of :func:`tests.support.metadata_race.check_race`)."""

from __future__ import annotations

import asyncio
import random
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from s3stream.ids import NodeId, StreamId
from s3stream.metadata.postgres import PostgresMetadataStore
from tests.support.metadata_race import NODE_EPOCH, RaceNode, check_race
from tests.support.postgres import fresh_schema

SHARED_STREAMS = 2
ACTIONS = st.one_of(
    st.tuples(st.just("take"), st.integers(0, SHARED_STREAMS - 1)),
    st.tuples(st.sampled_from(["commit", "commit", "release", "create"]), st.just(0)),
)
SCRIPTS = st.lists(st.lists(ACTIONS, min_size=1, max_size=10), min_size=3, max_size=3)


async def _run(url: str, scripts: list[list[tuple[str, int]]]) -> None:
    setup = await PostgresMetadataStore.open(url)
    stores = [await PostgresMetadataStore.open(url, connections=1) for _ in scripts]
    try:
        await setup.register_node(node_id=NodeId(99), node_epoch=NODE_EPOCH)
        streams = [await setup.create_stream(node_id=NodeId(99), node_epoch=NODE_EPOCH) for _ in range(2)]
        nodes = [RaceNode(store, NodeId(i + 1), streams, random.Random(i)) for i, store in enumerate(stores)]
        for node in nodes:
            await node.store.register_node(node_id=node.node_id, node_epoch=NODE_EPOCH)

        async def play(node: RaceNode, script: list[tuple[str, int]]) -> None:
            for action, arg in script:
                if action == "take":
                    await node.take(StreamId(streams[arg]))
                elif action == "commit" and node.held:
                    await node.commit()
                elif action == "release":
                    await node.release()
                elif action == "create":
                    await node.create()

        await asyncio.gather(*(play(node, script) for node, script in zip(nodes, scripts, strict=True)))
        events: list[dict[str, Any]] = [e for node in nodes for e in node.events]
        await check_race(setup, events, streams)
    finally:
        for store in (setup, *stores):
            await store.close()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scripts=SCRIPTS)
def test_any_interleaving_of_three_nodes_keeps_the_invariants(scripts: list[list[tuple[str, int]]]) -> None:
    with fresh_schema() as url:
        asyncio.run(_run(url, scripts))
