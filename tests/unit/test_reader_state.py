"""Reader states and the readahead sizing rule (s3stream.engine.readstate), without I/O."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from s3stream.engine.blockcache import BlockKey
from s3stream.engine.readstate import (
    STATE_IDLE_S,
    STATE_MAX_COUNT,
    BlockRef,
    ReadaheadSettings,
    ReadState,
    ReadStates,
    default_free_guard_bytes,
    readahead_size,
)
from s3stream.errors import InvalidArgumentError
from s3stream.ids import ObjectId, StreamId
from s3stream.objectformat import IndexEntry

SETTINGS = ReadaheadSettings(
    initial_bytes=100, step_bytes=50, max_bytes=300, free_guard_bytes=1000, pause_s=60
)


def size(state: ReadState, *, misses: int = 0, evicted: int = 0, free: int = 10_000, now: float = 0.0) -> int:
    return readahead_size(
        state, SETTINGS, miss_count=misses, evicted_unread_count=evicted, cache_free_bytes=free, now_s=now
    )


def test_readahead_doubles_on_misses_up_to_the_cap_and_respects_the_free_guard() -> None:
    state = ReadState(StreamId(1), 0, SETTINGS.initial_bytes)
    assert size(state) == 100
    assert size(state, misses=1) == 200  # doubled (more than one step of 50)
    assert size(state, misses=10) == 300  # capped
    state.readahead_bytes = 100
    assert size(state, misses=3) == 250  # three steps are more than doubling
    fixed = ReadaheadSettings(initial_bytes=100, step_bytes=50, growth_factor=1, max_bytes=300)
    state.readahead_bytes = 100
    readahead_size(state, fixed, miss_count=1, evicted_unread_count=0, cache_free_bytes=10**9, now_s=0.0)
    assert state.readahead_bytes == 150  # AutoMQ's rule: one step per miss
    assert size(state, free=1000 + 120) == 120  # the cache keeps free_guard_bytes free of readahead
    assert size(state, free=1000 + 50) == 0  # less than the initial size fits: none


@pytest.mark.parametrize(
    "bad",
    [
        {"growth_factor": 0},
        {"initial_bytes": 0},
        {"initial_bytes": 10, "max_bytes": 5},
        {"step_bytes": -1},
        {"pause_s": -1.0},
        {"load_max_bytes": 0},
    ],
)
def test_bad_readahead_settings_are_invalid(bad: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgumentError):
        ReadaheadSettings(**bad)


def test_an_evicted_unread_block_resets_and_pauses_readahead() -> None:
    state = ReadState(StreamId(1), 0, 300)
    assert size(state, evicted=1, now=10.0) == 0
    assert state.readahead_bytes == SETTINGS.initial_bytes
    assert size(state, evicted=1, now=10.0 + SETTINGS.pause_s - 1) == 0
    assert size(state, evicted=1, now=10.0 + SETTINGS.pause_s) == 100


def test_states_are_bounded_expire_when_idle_and_release_their_blocks() -> None:
    released: list[BlockKey] = []
    now = [0.0]

    def release(keys: Sequence[BlockKey]) -> None:
        released.extend(keys)

    states = ReadStates(initial_readahead_bytes=100, release=release, clock=lambda: now[0])
    first = states.take(StreamId(1), 0)
    first.held.add(BlockKey(ObjectId(7), 0))
    first.next_offset = 10
    states.put(first)
    assert states.take(StreamId(1), 10) is first  # the consumer continues where it stopped
    states.put(first)
    now[0] = STATE_IDLE_S
    other = states.take(StreamId(2), 0)  # the idle one expires
    assert first.dropped
    assert released == [BlockKey(ObjectId(7), 0)]
    assert list(states.idle) == []
    assert states.active == {other}
    for i in range(STATE_MAX_COUNT + 1):
        states.put(ReadState(StreamId(3), i, 100, last_used_s=now[0]))
    assert len(states.idle) == STATE_MAX_COUNT
    assert (StreamId(3), 0) not in states.idle  # the least recently used one went
    assert len(states.drop_all()) == STATE_MAX_COUNT + 1
    assert states.idle == {}


def test_a_load_is_at_most_load_max_bytes() -> None:
    settings = ReadaheadSettings(initial_bytes=1000, max_bytes=1000, load_max_bytes=100, free_guard_bytes=0)
    state = ReadState(StreamId(1), 0, 1000)
    got = readahead_size(
        state, settings, miss_count=0, evicted_unread_count=0, cache_free_bytes=10**6, now_s=0.0
    )
    assert got == 100  # loads of one merged GET each, several in flight, instead of one big load


def test_blocks_a_read_loads_itself_are_not_counted_as_readahead() -> None:
    settings = ReadaheadSettings(initial_bytes=300, max_bytes=300, free_guard_bytes=0)
    state = ReadState(StreamId(1), 0, 300)
    state.window = [
        BlockRef(ObjectId(1), "k", 10_000, IndexEntry(1, i * 10, i * 10 + 10, 1, i * 100, 100))
        for i in range(5)
    ]
    state.readahead_end_offset = 10  # the read at offset 0 loads [0, 10) itself

    def size(consumer_offset: int | None) -> int:
        return readahead_size(
            state,
            settings,
            miss_count=0,
            evicted_unread_count=0,
            cache_free_bytes=10**6,
            now_s=0.0,
            consumer_offset=consumer_offset,
        )

    assert size(None) == 200  # from the consumer's position: 100 of 300 bytes are ahead already
    assert size(10) == 300  # from the end of the read's own blocks: the whole window


def test_loads_refill_the_window_in_chunks_of_half_of_it() -> None:
    settings = ReadaheadSettings(initial_bytes=1000, max_bytes=1000, load_max_bytes=1000, free_guard_bytes=0)
    state = ReadState(StreamId(1), 0, 1000)
    state.window = [
        BlockRef(ObjectId(1), "k", 10_000, IndexEntry(1, i * 10, i * 10 + 10, 1, i * 100, 100))
        for i in range(10)
    ]

    def size(loaded_to: int) -> int:
        state.readahead_end_offset = loaded_to
        return readahead_size(
            state, settings, miss_count=0, evicted_unread_count=0, cache_free_bytes=10**6, now_s=0.0
        )

    assert size(60) == 0  # 400 of 1000 missing: less than half the window, no load yet
    assert size(50) == 500  # half: one load of it (few large GETs, not one per quarter)


def test_the_default_free_guard_is_automqs_32_mib_at_most_a_quarter_of_the_cache() -> None:
    MiB = 1 << 20
    assert default_free_guard_bytes(64 * MiB) == 16 * MiB
    assert default_free_guard_bytes(1024 * MiB) == 32 * MiB
    assert ReadaheadSettings().free_guard_bytes is None  # the reader sizes it to its cache
    assert ReadaheadSettings().max_bytes == 48 * MiB  # three quarters of the default 64 MiB cache
    state = ReadState(StreamId(1), 0, 8 * MiB)
    no_cache = readahead_size(
        state, ReadaheadSettings(), miss_count=0, evicted_unread_count=0, cache_free_bytes=40 * MiB, now_s=0.0
    )
    assert no_cache == 8 * MiB  # without a cache to size it to: AutoMQ's 32 MiB guard
    state.readahead_tasks.clear()
    assert (
        readahead_size(
            state,
            ReadaheadSettings(),
            miss_count=0,
            evicted_unread_count=0,
            cache_free_bytes=36 * MiB,
            now_s=0.0,
        )
        == 4 * MiB
    )
