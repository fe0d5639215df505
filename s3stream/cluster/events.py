"""Assignment events: what a node gained and lost, fanned out to every subscriber without blocking the node.

:class:`AssignmentHub` is one node's publisher. Each :meth:`AssignmentHub.subscribe` is a new
:class:`Subscription` (``client.streams.assignments()``) that sees the events published from its creation
on, in publication order. Publishing never waits: each subscription has a bounded queue
(:data:`SUBSCRIPTION_QUEUE_MAX` events). A subscriber that falls that far behind is **cut off**: it is
removed from the hub, and its iterator yields the events already queued, then raises
:class:`~s3stream.errors.CapacityError` (it has missed events; subscribe again and re-read what this
node holds). The node and every other subscriber go on unaffected.

When the hub closes (the client closes) every subscription ends after its queued events; when the
node is fenced, the iterators raise the fence's error after its "lost" events.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from s3stream.errors import CapacityError, S3StreamError
from s3stream.ids import StreamId

if TYPE_CHECKING:
    from s3stream.engine.client import Stream

SUBSCRIPTION_QUEUE_MAX = 10_000
"""Events one subscription may hold unread before it is cut off (a move of 100 streams is 100)."""


@dataclass(frozen=True, slots=True)
class AssignmentEvent:
    """This node gained a stream (``stream``: the open Stream to append to) or lost one (``stream`` None)."""

    kind: Literal["gained", "lost"]
    stream_id: StreamId
    stream: Stream | None = None


class Subscription:
    """One subscriber's events: an async iterator (``async for event in client.streams.assignments()``).

    Invariant: it holds at most :data:`SUBSCRIPTION_QUEUE_MAX` events; once ``_end`` is set nothing is
    added, and the iterator ends (None) or raises (an error) after the queued events."""

    def __init__(self, hub: AssignmentHub) -> None:
        self._hub = hub
        self._queue: deque[AssignmentEvent] = deque()
        self._wakeup = asyncio.Event()
        self._ended = False
        self._end_error: S3StreamError | None = None

    def _offer(self, event: AssignmentEvent) -> bool:
        """Queue ``event``; False (and the subscription is cut off) when it is full."""
        if self._ended:
            return True
        if len(self._queue) >= SUBSCRIPTION_QUEUE_MAX:
            self._finish(
                CapacityError(
                    f"assignment events: this subscriber fell {SUBSCRIPTION_QUEUE_MAX} events behind and was "
                    "cut off; subscribe again and re-read the streams this node holds"
                )
            )
            return False
        self._queue.append(event)
        self._wakeup.set()
        return True

    def _finish(self, error: S3StreamError | None) -> None:
        if not self._ended:
            self._ended = True
            self._end_error = error
            self._wakeup.set()

    @property
    def pending_count(self) -> int:
        """Events queued and not read yet."""
        return len(self._queue)

    def close(self) -> None:
        """Unsubscribe: the iterator ends after the events already queued."""
        self._hub.unsubscribe(self)
        self._finish(None)

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> AssignmentEvent:
        while not self._queue:
            if self._ended:
                if self._end_error is not None:
                    raise self._end_error
                raise StopAsyncIteration
            self._wakeup.clear()
            await self._wakeup.wait()
        return self._queue.popleft()

    async def next_event(self) -> AssignmentEvent | None:
        """The next event, or None once the subscription has ended (for callers that cannot catch
        StopAsyncIteration, such as the blocking facade)."""
        try:
            return await self.__anext__()
        except StopAsyncIteration:
            return None


class AssignmentHub:
    """Fan-out of one node's assignment events to its subscriptions (never blocks the publisher)."""

    def __init__(self) -> None:
        self._subscriptions: list[Subscription] = []
        self._ended = False
        self._end_error: S3StreamError | None = None
        self.published_count = 0
        self.cut_off_count = 0

    def subscribe(self) -> Subscription:
        """A new subscription to the events published from now on (an ended hub gives an ended one)."""
        subscription = Subscription(self)
        if self._ended:
            subscription._finish(self._end_error)
        else:
            self._subscriptions.append(subscription)
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        if subscription in self._subscriptions:
            self._subscriptions.remove(subscription)

    def publish(self, event: AssignmentEvent) -> None:
        """Give ``event`` to every subscription now (a full one is cut off, see the module doc)."""
        if self._ended:
            return
        self.published_count += 1
        for subscription in list(self._subscriptions):
            if not subscription._offer(event):
                self.cut_off_count += 1
                self.unsubscribe(subscription)

    def close(self, error: S3StreamError | None = None) -> None:
        """End every subscription after its queued events (raising ``error`` then, if given)."""
        if self._ended:
            return
        self._ended = True
        self._end_error = error
        subscriptions, self._subscriptions = self._subscriptions, []
        for subscription in subscriptions:
            subscription._finish(error)
