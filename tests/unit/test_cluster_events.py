"""Assignment events: each subscriber sees the events from its creation on, in order; a full one is cut off
without blocking the publisher or the other subscribers; close and fence end the iterators."""

from __future__ import annotations

import asyncio

import pytest

from s3stream.cluster import events
from s3stream.cluster.events import AssignmentEvent, AssignmentHub
from s3stream.errors import CapacityError, ErrorCode, FencedError
from s3stream.ids import StreamId


def lost(stream_id: int) -> AssignmentEvent:
    return AssignmentEvent("lost", StreamId(stream_id))


async def drain(subscription: events.Subscription) -> list[int]:
    return [event.stream_id async for event in subscription]


async def test_a_subscriber_sees_events_from_its_creation_on_in_order() -> None:
    hub = AssignmentHub()
    early = hub.subscribe()
    hub.publish(lost(1))
    late = hub.subscribe()
    hub.publish(lost(2))
    hub.publish(lost(3))
    hub.close()
    assert await drain(early) == [1, 2, 3]
    assert await drain(late) == [2, 3]


async def test_a_waiting_subscriber_wakes_on_publish() -> None:
    hub = AssignmentHub()
    subscription = hub.subscribe()
    waiter = asyncio.create_task(anext(subscription))
    await asyncio.sleep(0.01)
    assert not waiter.done()
    hub.publish(AssignmentEvent("gained", StreamId(7)))
    event = await asyncio.wait_for(waiter, 1)
    assert (event.kind, event.stream_id, event.stream) == ("gained", 7, None)


async def test_a_full_subscriber_is_cut_off_and_the_others_go_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(events, "SUBSCRIPTION_QUEUE_MAX", 3)
    hub = AssignmentHub()
    slow, fast = hub.subscribe(), hub.subscribe()
    received = []
    for i in range(6):
        hub.publish(lost(i))  # never waits
        received.append((await anext(fast)).stream_id)
    assert received == [0, 1, 2, 3, 4, 5]
    assert hub.cut_off_count == 1
    assert [(await anext(slow)).stream_id for _ in range(3)] == [0, 1, 2]
    with pytest.raises(CapacityError):
        await anext(slow)
    hub.publish(lost(9))
    assert (await anext(fast)).stream_id == 9


async def test_unsubscribe_ends_the_iterator_after_its_queued_events() -> None:
    hub = AssignmentHub()
    subscription = hub.subscribe()
    hub.publish(lost(1))
    subscription.close()
    hub.publish(lost(2))
    assert await drain(subscription) == [1]
    assert await subscription.next_event() is None


async def test_a_fence_ends_every_subscription_with_its_error_after_the_queued_events() -> None:
    hub = AssignmentHub()
    subscription = hub.subscribe()
    hub.publish(lost(4))
    fence = FencedError("lease ended", code=ErrorCode.NODE_FENCED)
    hub.close(fence)
    assert (await anext(subscription)).stream_id == 4
    with pytest.raises(FencedError) as raised:
        await anext(subscription)
    assert raised.value is fence
    with pytest.raises(FencedError):
        await anext(hub.subscribe())  # subscribing after the end: ended at once
