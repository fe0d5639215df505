"""The failover controller's decisions (pure: nodes and takeovers in, one decision out)."""

from __future__ import annotations

from s3stream.cluster.controller import ReassignTakeover, StartTakeover, decide, next_taker, owners
from s3stream.ids import NodeId, StreamId
from s3stream.metadata.base import (
    NodeInfo,
    RangeMetadata,
    StreamMetadata,
    StreamState,
    TakeoverInfo,
    TakeoverState,
)

NOW = 100_000


def node(node_id: int, epoch: int = 1, *, expires: int = NOW + 5_000) -> NodeInfo:
    return NodeInfo(NodeId(node_id), epoch, expires, NOW - 1_000, 0)


def dead(node_id: int, epoch: int = 1) -> NodeInfo:
    return node(node_id, epoch, expires=NOW - 1)


def takeover(
    node_id: int, state: TakeoverState, *, taker: int = -1, taker_epoch: int = -1, attempt: int = 1
) -> TakeoverInfo:
    return TakeoverInfo(
        node_id=NodeId(node_id), node_epoch=1, fence_epoch=2, wal_path="/w", streams=((StreamId(1), 3),),
        state=state, taker_node_id=taker, taker_node_epoch=taker_epoch, attempt=attempt,
        created_at_ms=NOW - 500, updated_at_ms=NOW - 500,
    )  # fmt: skip


def stream(stream_id: int, owner: int, state: StreamState = StreamState.OPENED) -> StreamMetadata:
    rng = RangeMetadata(StreamId(stream_id), 1, 0, 0, 10, NodeId(owner))
    return StreamMetadata(StreamId(stream_id), 1, state, 0, 10, (rng,))


def test_owners_are_the_nodes_of_the_last_range_of_opened_streams() -> None:
    streams = [
        stream(1, 4),
        stream(2, 5, StreamState.CLOSED),
        StreamMetadata(StreamId(3), -1, StreamState.OPENED, 0, 0),
    ]
    assert owners(streams) == {4}


def test_a_lapsed_owner_is_fenced_and_given_to_the_next_live_node() -> None:
    nodes = [node(1), dead(2, epoch=7), node(3)]
    decision = decide(nodes, [], owner_ids={2}, now_ms=NOW, last_taker=1)
    assert decision == StartTakeover(NodeId(2), 7, 3, 1)


def test_takers_go_round_robin_and_never_to_the_dead_node() -> None:
    live = [node(1), node(3), node(5)]
    assert next_taker(live, after=-1, excluded=9) == live[0]
    assert next_taker(live, after=1, excluded=9) == live[1]
    assert next_taker(live, after=5, excluded=9) == live[0]
    assert next_taker(live, after=1, excluded=3) == live[2]
    assert next_taker([node(3)], after=-1, excluded=3) is None


def test_a_lapsed_node_owning_nothing_is_left_alone() -> None:
    assert decide([node(1), dead(2)], [], owner_ids={1}, now_ms=NOW, last_taker=-1) is None


def test_no_start_without_the_owners() -> None:
    assert decide([node(1), dead(2)], [], owner_ids=None, now_ms=NOW, last_taker=-1) is None


def test_with_no_live_node_the_dead_one_is_fenced_and_left_pending() -> None:
    assert decide([dead(2, epoch=4)], [], owner_ids={2}, now_ms=NOW, last_taker=-1) == StartTakeover(
        NodeId(2), 4, -1, -1
    )


def test_an_unleased_session_never_lapses_and_never_takes_over() -> None:
    unleased = NodeInfo(NodeId(1), 1, -1, -1, 0)
    assert decide([unleased], [], owner_ids={1}, now_ms=NOW, last_taker=-1) is None
    assert decide([unleased, dead(2)], [], owner_ids={2}, now_ms=NOW, last_taker=-1) == StartTakeover(
        NodeId(2), 1, -1, -1
    )


def test_the_oldest_lapsed_node_goes_first() -> None:
    nodes = [node(1), node(2, expires=NOW - 10), node(3, expires=NOW - 900)]
    decision = decide(nodes, [], owner_ids={2, 3}, now_ms=NOW, last_taker=-1)
    assert isinstance(decision, StartTakeover)
    assert decision.node_id == 3


def test_one_takeover_in_flight_at_a_time() -> None:
    nodes = [node(1), node(3), dead(4)]
    running = takeover(2, TakeoverState.RUNNING, taker=1, taker_epoch=1)
    assert decide(nodes, [running], owner_ids={4}, now_ms=NOW, last_taker=1) is None


def test_a_takeover_whose_taker_lapsed_is_reassigned() -> None:
    nodes = [dead(1), node(3), dead(2)]
    running = takeover(2, TakeoverState.RUNNING, taker=1, taker_epoch=1, attempt=1)
    assert decide(nodes, [running], owner_ids=None, now_ms=NOW, last_taker=1) == ReassignTakeover(
        NodeId(2), 3, 1, 1, 2
    )


def test_a_takeover_whose_taker_restarted_is_reassigned() -> None:
    nodes = [node(1, epoch=2), node(3), dead(2)]
    running = takeover(2, TakeoverState.RUNNING, taker=1, taker_epoch=1)
    decision = decide(nodes, [running], owner_ids=None, now_ms=NOW, last_taker=3)
    assert isinstance(decision, ReassignTakeover)
    assert (decision.taker_node_id, decision.taker_node_epoch) == (1, 2)


def test_a_pending_takeover_gets_a_taker_once_a_node_lives() -> None:
    pending = takeover(2, TakeoverState.PENDING, attempt=0)
    assert decide([dead(2)], [pending], owner_ids=None, now_ms=NOW, last_taker=-1) is None
    assert decide(
        [dead(2), node(5)], [pending], owner_ids=None, now_ms=NOW, last_taker=-1
    ) == ReassignTakeover(NodeId(2), 5, 1, -1, 1)


def test_done_takeovers_do_not_block_new_ones() -> None:
    done = takeover(2, TakeoverState.DONE, taker=1, taker_epoch=1)
    decision = decide([node(1), dead(4)], [done], owner_ids={4}, now_ms=NOW, last_taker=-1)
    assert isinstance(decision, StartTakeover)
    assert decision.node_id == 4
