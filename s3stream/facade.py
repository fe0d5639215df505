"""The synchronous facade: blocking twins of Client, StreamClient, Stream and KVClient.

One event loop (uvloop where installed) runs in a daemon thread owned by the :class:`SyncClient`;
every blocking method hands its coroutine to that loop with ``asyncio.run_coroutine_threadsafe`` and
waits for the result; if the waiting thread is interrupted (KeyboardInterrupt, a signal handler's
exception) the engine call is cancelled on the loop before the interruption propagates. There is no
logic here beyond that: arguments go through unchanged and errors
come back unchanged (the same exception objects the async API raised). Calling a facade method from
inside its own loop thread would deadlock and raises :class:`~s3stream.errors.InvalidArgumentError`.

    with s3stream.open_sync("/tmp/data") as client:
        with client.streams.create_and_open_stream() as stream:
            offset = stream.append(RecordBatch(b"hello"))
            batches = stream.fetch(offset, offset + 1)
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, TypeVar

from s3stream._loop import new_event_loop
from s3stream.cluster.events import Subscription
from s3stream.engine.client import Client, KVClient, Stream, StreamClient
from s3stream.errors import ClosedError, InvalidArgumentError
from s3stream.ids import ObjectId, StreamId
from s3stream.metadata.base import CommittedObject, StreamMetadata
from s3stream.model import FetchedBatch, RecordBatch

T = TypeVar("T")


class _LoopThread:
    """An event loop running forever in its own daemon thread."""

    def __init__(self) -> None:
        self.loop = new_event_loop()
        self._thread = threading.Thread(target=self._main, name="s3stream-sync-loop", daemon=True)
        self._stopped = False
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait for its result (or its exception)."""
        if self._stopped:
            coro.close()
            raise ClosedError("the synchronous client is closed")
        if threading.current_thread() is self._thread:
            coro.close()
            raise InvalidArgumentError("a synchronous s3stream call was made from its own event loop thread")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result()
        except BaseException:
            # Interrupted while waiting (KeyboardInterrupt, a signal handler's exception): the engine
            # call must not run on unobserved. Cancelling the concurrent future cancels its task on
            # the loop; a call that already finished is left as it is.
            future.cancel()
            raise

    def call(self, fn: Callable[[], T]) -> T:
        """Evaluate ``fn`` on the loop thread (reads of engine state)."""

        async def wrapper() -> T:
            return fn()

        return self.run(wrapper())

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


class SyncKVClient:
    """Blocking :class:`~s3stream.engine.client.KVClient`."""

    def __init__(self, kv: KVClient, runner: _LoopThread) -> None:
        self._kv = kv
        self._run = runner

    def put_if_absent(self, key: str, value: bytes) -> bytes:
        return self._run.run(self._kv.put_if_absent(key, value))

    def put(self, key: str, value: bytes) -> bytes:
        return self._run.run(self._kv.put(key, value))

    def get(self, key: str) -> bytes | None:
        return self._run.run(self._kv.get(key))

    def delete(self, key: str) -> bytes | None:
        return self._run.run(self._kv.delete(key))


class SyncStream:
    """Blocking :class:`~s3stream.engine.client.Stream`; ``with`` closes it."""

    def __init__(self, stream: Stream, runner: _LoopThread) -> None:
        self.stream = stream
        """The async stream behind this one (use it only from the client's loop)."""
        self._run = runner
        self.stream_id: StreamId = stream.stream_id
        self.epoch: int = stream.epoch

    @property
    def start_offset(self) -> int:
        return self._run.call(lambda: self.stream.start_offset)

    @property
    def confirm_offset(self) -> int:
        return self._run.call(lambda: self.stream.confirm_offset)

    @property
    def next_offset(self) -> int:
        return self._run.call(lambda: self.stream.next_offset)

    def append(self, batch: RecordBatch, expected_offset: int | None = None) -> int:
        return self._run.run(self.stream.append(batch, expected_offset))

    def fetch(self, start_offset: int, end_offset: int, max_bytes: int = 1 << 20) -> list[FetchedBatch]:
        return self._run.run(self.stream.fetch(start_offset, end_offset, max_bytes))

    def trim(self, new_start_offset: int) -> None:
        self._run.run(self.stream.trim(new_start_offset))

    def close(self) -> None:
        self._run.run(self.stream.close())

    def destroy(self) -> None:
        self._run.run(self.stream.destroy())

    def __enter__(self) -> SyncStream:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SyncStream(stream_id={self.stream_id}, epoch={self.epoch})"


class SyncStreamClient:
    """Blocking :class:`~s3stream.engine.client.StreamClient`."""

    def __init__(self, streams: StreamClient, runner: _LoopThread) -> None:
        self._streams = streams
        self._run = runner

    def create_stream(self, *, tags: Mapping[str, str] | None = None) -> StreamId:
        return self._run.run(self._streams.create_stream(tags=tags))

    def create_and_open_stream(self, *, epoch: int = 0, tags: Mapping[str, str] | None = None) -> SyncStream:
        stream = self._run.run(self._streams.create_and_open_stream(epoch=epoch, tags=tags))
        return SyncStream(stream, self._run)

    def open_stream(self, stream_id: StreamId, *, epoch: int) -> SyncStream:
        return SyncStream(self._run.run(self._streams.open_stream(stream_id, epoch=epoch)), self._run)

    def list_streams(self) -> list[StreamMetadata]:
        return self._run.run(self._streams.list_streams())

    def reassign(self, stream_ids: Iterable[StreamId], to_node: int, *, timeout_s: float = 30.0) -> None:
        self._run.run(self._streams.reassign(stream_ids, to_node, timeout_s=timeout_s))

    def assignments(self) -> SyncAssignments:
        """A blocking iterator of this node's assignment events from now on (``stream``: a SyncStream)."""
        return SyncAssignments(self._run.call(self._streams.assignments), self._run)


@dataclass(frozen=True, slots=True)
class SyncAssignmentEvent:
    """:class:`~s3stream.cluster.events.AssignmentEvent` with a :class:`SyncStream`."""

    kind: Literal["gained", "lost"]
    stream_id: StreamId
    stream: SyncStream | None = None


class SyncAssignments:
    """Blocking twin of :class:`~s3stream.cluster.events.Subscription`: ``for event in ...`` blocks for
    the next event; ``close()`` unsubscribes."""

    def __init__(self, subscription: Subscription, runner: _LoopThread) -> None:
        self.subscription = subscription
        self._run = runner

    def __iter__(self) -> Iterator[SyncAssignmentEvent]:
        return self

    def __next__(self) -> SyncAssignmentEvent:
        event = self._run.run(self.subscription.next_event())
        if event is None:
            raise StopIteration
        stream = None if event.stream is None else SyncStream(event.stream, self._run)
        return SyncAssignmentEvent(event.kind, event.stream_id, stream)

    def close(self) -> None:
        self._run.call(self.subscription.close)


class SyncClient:
    """Blocking :class:`~s3stream.engine.client.Client`; ``with`` closes it. Build with ``s3stream.open_sync``."""

    def __init__(self, client: Client, runner: _LoopThread) -> None:
        self.client = client
        """The async client behind this one (use it only from :attr:`loop`)."""
        self._run = runner
        self.streams = SyncStreamClient(client.streams, runner)
        self.kv = SyncKVClient(client.kv, runner)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the async client runs on."""
        return self._run.loop

    @property
    def metrics_endpoint(self) -> str | None:
        """``http://host:port/metrics`` while metrics are on (:mod:`s3stream.metrics`), else None."""
        return self.client.metrics_endpoint

    def append_atomic(
        self,
        appends: Sequence[tuple[SyncStream, RecordBatch] | tuple[SyncStream, RecordBatch, int | None]],
        *,
        kv: Mapping[str, bytes] | None = None,
    ) -> list[int]:
        """Entries ``(stream, batch)`` or ``(stream, batch, expected base offset)``: see the async twin."""
        if not isinstance(appends, Iterable):
            raise InvalidArgumentError(
                f"appends must be a sequence of (SyncStream, RecordBatch[, expected offset]) tuples, "
                f"got {type(appends).__name__}"
            )
        entries: list[Any] = []
        for item in appends:
            if not isinstance(item, tuple) or not item or not isinstance(item[0], SyncStream):
                raise InvalidArgumentError(
                    "appends must be (SyncStream, RecordBatch) or (SyncStream, RecordBatch, expected offset) "
                    f"tuples, got {type(item).__name__}"
                    + (f" of {type(item[0]).__name__}" if isinstance(item, tuple) and item else "")
                )
            entries.append((item[0].stream, *item[1:]))
        return self._run.run(self.client.append_atomic(entries, kv=kv))

    def prepare_objects(self, count: int, *, ttl_ms: int | None = None) -> ObjectId:
        """See :meth:`s3stream.engine.client.Client.prepare_objects`."""
        return self._run.run(self.client.prepare_objects(count, ttl_ms=ttl_ms))

    def commit_objects(
        self,
        streams: Sequence[SyncStream],
        objects: Sequence[CommittedObject],
        *,
        kv_puts: Mapping[str, bytes] | None = None,
        kv_expect: Mapping[str, bytes | None] | None = None,
        release_ids: Sequence[ObjectId] = (),
    ) -> None:
        """See :meth:`s3stream.engine.client.Client.commit_objects`."""
        for stream in streams:
            if not isinstance(stream, SyncStream):
                raise InvalidArgumentError(f"streams must be SyncStreams, got {type(stream).__name__}")
        self._run.run(
            self.client.commit_objects(
                [s.stream for s in streams],
                objects,
                kv_puts=kv_puts,
                kv_expect=kv_expect,
                release_ids=release_ids,
            )
        )

    def settle_external(self, streams: Sequence[SyncStream]) -> int:
        """See :meth:`s3stream.engine.client.Client.settle_external`."""
        for stream in streams:
            if not isinstance(stream, SyncStream):
                raise InvalidArgumentError(f"streams must be SyncStreams, got {type(stream).__name__}")
        return self._run.run(self.client.settle_external([s.stream for s in streams]))

    def close(self) -> None:
        """Close the client (every open stream forces its data up), then stop the loop thread."""
        try:
            self._run.run(self.client.close())
        except ClosedError:
            pass  # already closed
        finally:
            self._run.stop()

    @classmethod
    def start(cls, opener: Callable[[], Coroutine[Any, Any, Client]]) -> SyncClient:
        """Start a loop thread, run ``opener()`` on it and wrap the client it returns.

        The assembly passes its own opener (``s3stream.open_sync``); this module never builds engines.
        """
        runner = _LoopThread()
        try:
            client = runner.run(opener())
        except BaseException:
            runner.stop()
            raise
        return cls(client, runner)

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
