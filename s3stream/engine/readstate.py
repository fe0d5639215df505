"""Reader states of the object read path: one per sequential consumer, with its readahead sizing.

A :class:`ReadState` is what :class:`~s3stream.engine.reader.ObjectStreamReader` remembers between
two reads of one consumer: its index window (the data blocks ahead, in offset order), the block-cache
entries it holds, and its readahead (size, how far loaded, the loads in flight, a pause after an
unread block was evicted). :class:`ReadStates` keeps them keyed by ``(stream, next offset)``, at most
:data:`STATE_MAX_COUNT`, dropping those idle for :data:`STATE_IDLE_S`. :func:`readahead_size` is
the sizing rule (AutoMQ's, ``docs/automq-model.md`` section 12): how many bytes to load ahead now, if any.
The reader does the I/O; nothing here awaits.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from s3stream.engine.blockcache import BlockKey
from s3stream.errors import InvalidArgumentError
from s3stream.ids import ObjectId, StreamId
from s3stream.objectformat import IndexEntry

KiB = 1024
MiB = 1024 * KiB

READAHEAD_TASKS_MAX = 4
"""Readahead loads in flight per reader state (each of at most the readahead size)."""
STATE_MAX_COUNT = 1024
STATE_IDLE_S = 60.0
"""Reader states unused this long are dropped (AutoMQ: 1 min)."""


FREE_GUARD_MAX_BYTES = 32 * MiB
"""AutoMQ's free-space guard: readahead leaves this much of the block cache free."""
FREE_GUARD_CACHE_DIVISOR = 4
"""The default guard is at most this fraction (1/4) of the block cache."""


def default_free_guard_bytes(cache_capacity_bytes: int) -> int:
    """AutoMQ's 32 MiB guard, at most a quarter of the block cache: 16 MiB of a 64 MiB cache (the
    32 MiB guard left readahead half of it, 3 GETs in flight on average; the read benchmark's raw
    baseline has 16 GETs of 4 MiB in flight)."""
    return min(FREE_GUARD_MAX_BYTES, cache_capacity_bytes // FREE_GUARD_CACHE_DIVISOR)


@dataclass(frozen=True, slots=True)
class ReadaheadSettings:
    """AutoMQ's readahead sizes: 512 KiB, growing on misses (see :func:`readahead_size`), 1 min
    pause; the window grows to 48 MiB (AutoMQ's 32 MiB) and the free guard is AutoMQ's 32 MiB at
    most a quarter of the block cache."""

    initial_bytes: int = 512 * KiB
    step_bytes: int = 512 * KiB
    max_bytes: int = 48 * MiB
    """Largest readahead window: loaded-unread blocks plus loads in flight ahead of the consumer.
    48 MiB: with the 16 MiB guard of a 64 MiB cache, readahead may fill three quarters of it."""
    free_guard_bytes: int | None = None
    """Cache bytes readahead leaves free; None: :func:`default_free_guard_bytes` of the cache it
    reads through (AutoMQ's 32 MiB when the reader does not say)."""
    pause_s: float = 60.0
    enabled: bool = True
    growth_factor: int = 2
    """A read with block misses multiplies the size by this, or adds ``step_bytes`` per miss if that
    is more (1: AutoMQ's step growth only)."""
    load_max_bytes: int = 8 * MiB
    """Largest single load (one merged GET of the reader): loads form a sliding window of at most
    :data:`READAHEAD_TASKS_MAX` GETs that complete in offset order, instead of bursts of big loads
    whose GETs share the bandwidth and all complete late. 8 MiB: four loads in flight are 32 MiB
    of the 48 MiB window; 4 MiB loads took ~1.5x the GETs and their client CPU."""

    def __post_init__(self) -> None:
        if not 0 < self.initial_bytes <= self.max_bytes:
            raise InvalidArgumentError("readahead initial size must be in (0, max]")
        if self.step_bytes < 0 or (self.free_guard_bytes or 0) < 0 or self.pause_s < 0:
            raise InvalidArgumentError("readahead step, guard and pause must not be negative")
        if self.growth_factor < 1:
            raise InvalidArgumentError("readahead growth factor must be at least 1")
        if self.load_max_bytes <= 0:
            raise InvalidArgumentError("readahead load size must be positive")


@dataclass(slots=True)
class BlockRef:
    """One data block of the window: where it is and what its index entry says."""

    object_id: ObjectId
    key: str
    object_size_bytes: int
    entry: IndexEntry

    @property
    def cache_key(self) -> BlockKey:
        return BlockKey(self.object_id, self.entry.start_position)


@dataclass(slots=True, eq=False)
class ReadState:
    """One sequential reader of one stream: its index window, held blocks and readahead."""

    stream_id: StreamId
    next_offset: int
    readahead_bytes: int
    window: list[BlockRef] = field(default_factory=list)
    """Blocks in offset order, each continuing the previous one."""
    held: set[BlockKey] = field(default_factory=set)
    readahead_end_offset: int = 0
    objects_prefetched_to: int = 0
    """The window end at which the objects after the window were last asked to open early."""
    readahead_tasks: set[asyncio.Task[None]] = field(default_factory=set)
    paused_until_s: float = 0.0
    evicted_seen: int = 0
    last_used_s: float = 0.0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Serializes window extension between the read and its readahead."""
    dropped: bool = False

    @property
    def window_end(self) -> int:
        return self.window[-1].entry.end_offset if self.window else self.next_offset


def readahead_size(
    state: ReadState,
    settings: ReadaheadSettings,
    *,
    miss_count: int,
    evicted_unread_count: int,
    cache_free_bytes: int,
    now_s: float,
    consumer_offset: int | None = None,
) -> int:
    """Bytes to load ahead of ``state``'s consumer now (0: none), updating its readahead size.

    The window counts from ``consumer_offset`` (default: the state's next offset; a read that is
    loading blocks itself passes where they end, so they do not count as readahead).

    An unread block evicted since the last look (``evicted_unread_count`` grew) resets the size and
    pauses readahead for ``pause_s``. A read with block misses (the consumer caught up with its
    readahead) multiplies the size by ``growth_factor`` (2), or grows it by ``step_bytes`` per miss
    if that is more, up to ``max_bytes``. AutoMQ grows by the step only; for a catch-up read of
    1 KiB records that took some 60 misses, about 100 MiB read with one or two GETs in flight, to
    reach 32 MiB.
    A load is at most ``load_max_bytes``; loads refill the window in chunks of at least half the
    window or a whole load, whichever is less, at most :data:`READAHEAD_TASKS_MAX` at once, and
    never into the cache's last ``free_guard_bytes`` (None here: AutoMQ's 32 MiB; the reader
    resolves None to :func:`default_free_guard_bytes` of its cache). Quarter-window chunks made
    3 MiB loads where a fast store keeps the consumer fed from a ~12 MiB window (28 GETs for 64 MiB
    of 64 KiB records in memory, 17 with half-window chunks).
    """
    if evicted_unread_count > state.evicted_seen:
        state.evicted_seen = evicted_unread_count
        state.readahead_bytes = settings.initial_bytes
        state.paused_until_s = now_s + settings.pause_s
    if now_s < state.paused_until_s:
        return 0
    if miss_count:  # the consumer caught up with its readahead
        size = state.readahead_bytes
        grown = max(size * settings.growth_factor, size + settings.step_bytes * miss_count)
        state.readahead_bytes = min(settings.max_bytes, grown)
    state.readahead_tasks = {t for t in state.readahead_tasks if not t.done()}
    if len(state.readahead_tasks) >= READAHEAD_TASKS_MAX:
        return 0
    consumer_at = state.next_offset if consumer_offset is None else consumer_offset
    ahead = sum(
        r.entry.size_bytes
        for r in state.window
        if r.entry.start_offset >= consumer_at and r.entry.end_offset <= state.readahead_end_offset
    )
    missing = state.readahead_bytes - ahead
    if missing < min(state.readahead_bytes // 2, settings.load_max_bytes):  # refill in big enough chunks
        return 0
    size_bytes = min(missing, settings.load_max_bytes)
    # what the free-space guard allows: the cache keeps free_guard_bytes free of readahead
    guard_bytes = FREE_GUARD_MAX_BYTES if settings.free_guard_bytes is None else settings.free_guard_bytes
    room_bytes = cache_free_bytes - guard_bytes
    if room_bytes < min(settings.initial_bytes, size_bytes):
        return 0
    return min(size_bytes, room_bytes)


class ReadStates:
    """The reader states of one reader: idle ones keyed by ``(stream, next offset)``, plus those in use."""

    def __init__(
        self,
        *,
        initial_readahead_bytes: int,
        release: Callable[[Sequence[BlockKey]], None],
        clock: Callable[[], float],
    ) -> None:
        self.idle: OrderedDict[tuple[StreamId, int], ReadState] = OrderedDict()
        """Least recently used first."""
        self.active: set[ReadState] = set()
        self._initial_readahead_bytes = initial_readahead_bytes
        self._release = release
        self._clock = clock

    def take(self, stream_id: StreamId, start_offset: int) -> ReadState:
        """The state of the consumer that stopped at ``start_offset`` (a new one if none), now in use."""
        now = self._clock()
        self._expire(now)
        state = self.idle.pop((stream_id, start_offset), None)
        if state is None:
            state = ReadState(stream_id, start_offset, self._initial_readahead_bytes)
        state.last_used_s = now
        self.active.add(state)
        return state

    def put(self, state: ReadState) -> None:
        """``state`` is idle again, under its new next offset; the oldest beyond the limit are dropped."""
        self.active.discard(state)
        key = (state.stream_id, state.next_offset)
        old = self.idle.pop(key, None)
        if old is not None:
            self.drop(old)
        self.idle[key] = state
        while len(self.idle) > STATE_MAX_COUNT:
            _, oldest = self.idle.popitem(last=False)
            self.drop(oldest)

    def drop(self, state: ReadState) -> None:
        """Forget ``state``: cancel its readahead and release its held blocks."""
        state.dropped = True
        self.active.discard(state)
        for task in state.readahead_tasks:
            task.cancel()
        self._release(list(state.held))
        state.held.clear()
        state.window.clear()

    def drop_all(self) -> list[ReadState]:
        """Drop every state (the reader closes); returns them so their readahead can be awaited."""
        states = list(self.idle.values()) + list(self.active)
        self.idle.clear()
        for state in states:
            self.drop(state)
        return states

    def _expire(self, now: float) -> None:
        while self.idle:
            key, state = next(iter(self.idle.items()))
            if now - state.last_used_s < STATE_IDLE_S:
                break
            del self.idle[key]
            self.drop(state)
