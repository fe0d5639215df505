"""The read path below the LogCache: stream ranges from objects, through the block cache, with readahead.

Design (AutoMQ's ``StreamReaders``/``StreamReader``, ``docs/automq-model.md`` section 12; the prose is
in ``docs/architecture.md`` "Read path"):

* A read of ``[start_offset, end_offset)`` of one stream walks an *index window*: the data blocks
  of the stream, in offset order, found through ``MetadataStore.get_objects`` (at most
  :data:`GET_OBJECTS_STEP` objects per lookup) and each object's cached index
  (:class:`~s3stream.objectformat.ObjectReaderCache`). Consecutive blocks must continue each other
  exactly; a window that does not is refreshed.
* Block data comes from the :class:`~s3stream.engine.blockcache.BlockCache`; the blocks missing from
  it are fetched with merged range GETs (consecutive blocks of one object, at most
  :data:`~s3stream.engine.readplan.MERGED_GET_MAX_BYTES` per GET, the GETs of one read running
  concurrently).
* A reader *state* (index window, held blocks, readahead) is kept per ``(stream, next offset)`` so a
  sequential consumer continues where it stopped. After each read (and each readahead load),
  readahead loads blocks ahead of the consumer: the window starts at 512 KiB and grows on block
  misses up to 48 MiB; loads (at most :data:`~s3stream.engine.readstate.READAHEAD_TASKS_MAX` at
  once) refill it in chunks of at least half the window (or a whole load), never filling the
  cache's last 32 MiB (at most a quarter of the cache); a block it loaded that was evicted before
  being read resets it and pauses it for a minute. A read that leaves loads in flight gives the
  event loop one turn before it returns, so a consumer working through loaded blocks, awaiting
  nothing else, does not hold back the next GETs.
* Objects replaced by compaction between the metadata lookup and the read (the GET says the object
  does not exist, or the new window does not continue) make the read refresh its window and retry,
  up to :data:`READ_RETRY_MAX` times.
* The result starts with the batch containing ``start_offset`` and continues without gap or
  overlap; anything else is a :class:`~s3stream.errors.CorruptionError`, never data.

:func:`~s3stream.engine.fetchmerge.merge_fetch` joins the object-storage head of a fetch with the
LogCache tail; reader states and the readahead sizing rule are in :mod:`s3stream.engine.readstate`,
the GET and readahead load plans in :mod:`s3stream.engine.readplan`, taking records out of blocks in
:mod:`s3stream.engine.readtake`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from s3stream.engine.blockcache import BlockCache, BlockKey, BlockRequest
from s3stream.engine.readplan import merged_runs, plan_load
from s3stream.engine.readstate import (
    BlockRef,
    ReadaheadSettings,
    ReadState,
    ReadStates,
    default_free_guard_bytes,
    readahead_size,
)
from s3stream.engine.readtake import take_each, take_slice
from s3stream.errors import (
    ClosedError,
    CorruptionError,
    InvalidArgumentError,
    NotFoundError,
    S3StreamError,
)
from s3stream.ids import StreamId
from s3stream.metadata.base import MetadataStore, ObjectSlice
from s3stream.objectformat import DataBlock, ObjectReader, ObjectReaderCache, object_key
from s3stream.record import StreamRecordBatch
from s3stream.storage.base import ObjectStorage

GET_OBJECTS_STEP = 4
"""Objects asked from metadata per window extension (AutoMQ's StreamReader)."""
READ_RETRY_MAX = 2
"""Retries of a read whose objects were replaced under it."""

_UNBOUNDED = (1 << 63) - 1


class _ObjectGoneError(Exception):
    """An object of the window vanished or the window does not continue: refresh and retry."""


@dataclass(frozen=True, slots=True)
class ReaderStats:
    read_count: int
    retry_count: int
    readahead_count: int
    block_miss_count: int
    block_hit_count: int


class ObjectStreamReader:
    """Reads stream ranges from object storage (see the module docstring)."""

    def __init__(
        self,
        metadata: MetadataStore,
        storage: ObjectStorage,
        *,
        namespace: str,
        block_cache: BlockCache[DataBlock],
        reader_cache: ObjectReaderCache,
        readahead: ReadaheadSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._metadata = metadata
        self._storage = storage
        self._namespace = namespace
        self._cache = block_cache
        self._readers = reader_cache
        settings = readahead or ReadaheadSettings()
        if settings.free_guard_bytes is None:
            guard_bytes = default_free_guard_bytes(block_cache.capacity_bytes)
            settings = dataclasses.replace(settings, free_guard_bytes=guard_bytes)
        self._readahead = settings
        self._clock = clock
        self._state_registry = ReadStates(
            initial_readahead_bytes=self._readahead.initial_bytes,
            release=lambda keys: block_cache.release(keys, read=False),
            clock=clock,
        )
        self._closed = False
        self._read_count = 0
        self._retry_count = 0
        self._readahead_count = 0
        self._miss_count = 0
        self._hit_count = 0

    @property
    def _states(self) -> OrderedDict[tuple[StreamId, int], ReadState]:
        """Idle reader states by ``(stream, next offset)`` (for tests)."""
        return self._state_registry.idle

    @property
    def block_cache(self) -> BlockCache[DataBlock]:
        """The block cache this reader reads through (its size is a metric)."""
        return self._cache

    def stats(self) -> ReaderStats:
        return ReaderStats(
            self._read_count, self._retry_count, self._readahead_count, self._miss_count, self._hit_count
        )

    # -- public -----------------------------------------------------------------------------
    async def read(
        self, stream_id: StreamId, start_offset: int, end_offset: int, max_bytes: int
    ) -> list[StreamRecordBatch]:
        """Batches of ``[start_offset, end_offset)`` from object storage, from the one containing
        ``start_offset``, contiguous, stopping at ``end_offset``, after ``max_bytes`` payload bytes
        (at least one batch) or where the stream's objects end."""
        if self._closed:
            raise ClosedError("the object stream reader is closed")
        if start_offset < 0 or end_offset < start_offset or max_bytes <= 0:
            raise InvalidArgumentError(
                f"bad read range [{start_offset}, {end_offset}) or max_bytes {max_bytes}"
            )
        if start_offset == end_offset:
            return []
        self._read_count += 1
        state = self._state_registry.take(stream_id, start_offset)
        try:
            for attempt in range(READ_RETRY_MAX + 1):
                try:
                    batches, miss_count = await self._read_once(state, start_offset, end_offset, max_bytes)
                    break
                except _ObjectGoneError as exc:
                    if attempt == READ_RETRY_MAX:
                        raise CorruptionError(
                            f"stream {stream_id} at offset {start_offset}: {exc} (after {attempt} retries)",
                            source=f"stream {stream_id}",
                        ) from exc
                    self._retry_count += 1
                    for task in state.readahead_tasks:  # they may hold plans made from stale metadata
                        task.cancel()
                    await self._reset_window(state)
        except BaseException:
            self._state_registry.drop(state)
            raise
        state.next_offset = batches[-1].end_offset if batches else start_offset
        if self._closed:  # closed while this read ran: keep nothing
            self._state_registry.drop(state)
            return batches
        self._state_registry.put(state)
        self._maybe_readahead(state, miss_count)
        if any(not task.done() for task in state.readahead_tasks):
            # One loop turn for the loads in flight: a consumer that works through loaded blocks
            # read after read never suspends, and the loads would neither send their GETs nor take
            # the responses off the sockets until it needs a block still loading (the consumer then
            # waited 0.19 s per 128 MiB catch-up read of 1 KiB records; now 0.06 s).
            await asyncio.sleep(0)
        return batches

    async def close(self) -> None:
        """Stop readahead and release every held block. Reads after this raise ClosedError."""
        if self._closed:
            return
        self._closed = True
        states = self._state_registry.drop_all()
        tasks = [t for s in states for t in s.readahead_tasks]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- one attempt ------------------------------------------------------------------------
    async def _read_once(
        self, state: ReadState, start_offset: int, end_offset: int, max_bytes: int
    ) -> tuple[list[StreamRecordBatch], int]:
        out: list[StreamRecordBatch] = []
        budget = max_bytes
        next_offset = start_offset
        miss_count = 0
        while True:
            refs = await self._blocks_for(state, next_offset, end_offset, budget)
            if not refs:
                break
            early_count = self._readahead_past(state, refs)
            blocks = await self._get_blocks(state, refs)
            miss_count += max(0, blocks.miss_count - early_count)
            done = False
            read_keys: list[BlockKey] = []
            for ref, block in zip(refs, blocks.values, strict=True):
                entry = ref.entry
                if (
                    next_offset == entry.start_offset
                    and entry.end_offset <= end_offset
                    and budget > entry.payload_bytes
                    and block.contiguous
                ):
                    out.extend(block.records)  # the whole block
                    next_offset = entry.end_offset
                    budget -= entry.payload_bytes
                    read_keys.append(ref.cache_key)
                    continue
                if block.contiguous:
                    next_offset, budget, done = take_slice(
                        out, block, ref, start_offset, next_offset, end_offset, budget
                    )
                else:
                    next_offset, budget, done = take_each(
                        out, block, ref, start_offset, next_offset, end_offset, budget
                    )
                if next_offset >= entry.end_offset:
                    read_keys.append(ref.cache_key)
                if done:
                    break
            self._consume(state, next_offset, read_keys)
            if done or next_offset >= end_offset or budget <= 0:
                break
        return out, miss_count

    def _consume(self, state: ReadState, next_offset: int, read_keys: list[BlockKey]) -> None:
        """Drop fully read blocks from the window and free them in the cache."""
        held = [k for k in read_keys if k in state.held]
        state.held.difference_update(held)
        self._cache.release(held, read=True)
        drop = 0
        while drop < len(state.window) and state.window[drop].entry.end_offset <= next_offset:
            drop += 1
        del state.window[:drop]

    async def _blocks_for(
        self, state: ReadState, next_offset: int, end_offset: int, budget: int
    ) -> list[BlockRef]:
        """Window blocks from the one holding ``next_offset`` until ``end_offset`` is covered or
        their estimated payload reaches ``budget`` (the first block counts only if it starts there)."""
        async with state.lock:
            return await self._blocks_for_locked(state, next_offset, end_offset, budget)

    async def _blocks_for_locked(
        self, state: ReadState, next_offset: int, end_offset: int, budget: int
    ) -> list[BlockRef]:
        if state.window and state.window[0].entry.start_offset > next_offset:
            await self._reset_window_locked(state)
        refs: list[BlockRef] = []
        estimate = 0
        i = 0
        while True:
            if i == len(state.window):
                last_end = state.window_end if state.window else -1
                if not await self._extend(state, next_offset, end_offset):
                    return refs
                # A consumer drops the blocks it read from the window's front without the lock
                # (_consume), also while this awaited the extension: go on at the first block after
                # the last one looked at, wherever it is now (an index would skip blocks or overrun).
                i = len(state.window)
                while i > 0 and state.window[i - 1].entry.start_offset >= last_end:
                    i -= 1
            ref = state.window[i]
            i += 1
            if ref.entry.end_offset <= next_offset:
                continue
            refs.append(ref)
            if ref.entry.start_offset >= next_offset:
                estimate += ref.entry.payload_bytes
            if ref.entry.end_offset >= end_offset or estimate >= budget:
                return refs

    async def _extend(self, state: ReadState, next_offset: int, end_offset: int) -> bool:
        """Append the blocks of the next objects to the window; False at the end of the stream's objects."""
        window_start = state.window_end if state.window else next_offset
        slices = await self._metadata.get_objects(
            stream_id=state.stream_id,
            start_offset=window_start,
            end_offset=-1 if end_offset >= _UNBOUNDED else end_offset,
            limit=GET_OBJECTS_STEP,
        )
        wanted = [sl for sl in slices if not (state.window and sl.end_offset <= state.window_end)]
        if not wanted:
            return False
        keys = [object_key(sl.object_id, self._namespace) for sl in wanted]
        for key, sl in zip(keys[1:], wanted[1:], strict=True):  # all open concurrently ...
            self._readers.prefetch(key, sl.size_bytes)
        end_before = state.window_end if state.window else -1  # (a consumer may drop blocks meanwhile)
        self._append_object(state, wanted[0], await self._open(wanted[0]), window_start)
        for key, sl in zip(keys[1:], wanted[1:], strict=True):  # ... the read waits for the first only
            reader = self._readers.peek(key, sl.size_bytes)
            if reader is None:
                break  # still opening: a later extension finds it
            self._append_object(state, sl, reader, window_start)
        return bool(state.window) and state.window_end > end_before

    async def _open(self, object_slice: ObjectSlice) -> ObjectReader:
        key = object_key(object_slice.object_id, self._namespace)
        try:
            return await self._readers.get(key, object_slice.size_bytes)
        except NotFoundError as exc:
            self._readers.invalidate(key)
            raise _ObjectGoneError(f"object {key} is gone") from exc

    def _append_object(
        self, state: ReadState, object_slice: ObjectSlice, reader: ObjectReader, window_start: int
    ) -> None:
        key = reader.key
        start = max(object_slice.start_offset, state.window_end if state.window else window_start)
        found = reader.find(state.stream_id, start, object_slice.end_offset, _UNBOUNDED)
        for entry in found.entries:
            if state.window:
                end = state.window_end
                if entry.end_offset <= end:
                    continue
                if entry.start_offset != end:
                    raise _ObjectGoneError(
                        f"object {key} continues offset {end} with a block starting at {entry.start_offset}"
                    )
            elif not entry.start_offset <= window_start < entry.end_offset:
                raise _ObjectGoneError(
                    f"object {key} does not hold offset {window_start} (its block starts at "
                    f"{entry.start_offset})"
                )
            state.window.append(BlockRef(object_slice.object_id, key, object_slice.size_bytes, entry))
        if not state.window or state.window_end < object_slice.end_offset:
            raise _ObjectGoneError(
                f"object {key} ends stream {state.stream_id} at {state.window_end if state.window else '-'}, "
                f"metadata says {object_slice.end_offset}"
            )

    async def _reset_window(self, state: ReadState) -> None:
        async with state.lock:
            await self._reset_window_locked(state)

    async def _reset_window_locked(self, state: ReadState) -> None:
        self._cache.release(list(state.held), read=False)
        state.held.clear()
        state.window.clear()
        state.readahead_end_offset = 0
        state.objects_prefetched_to = 0

    # -- block data -------------------------------------------------------------------------
    async def _get_blocks(self, state: ReadState, refs: Sequence[BlockRef]) -> CacheReadOfBlocks:
        by_key = {ref.cache_key: ref for ref in refs}
        requests = [
            BlockRequest(
                ref.cache_key, ref.entry.size_bytes, hold=_needs_hold(state, ref.cache_key, self._cache)
            )
            for ref in refs
        ]

        async def load(missing: Sequence[BlockRequest]) -> list[DataBlock]:
            return await self._load([by_key[r.key] for r in missing])

        # held from now on, so a concurrent read of this state does not hold the same block twice
        new_holds = [r.key for r in requests if r.hold and r.key not in state.held]
        state.held.update(new_holds)
        try:
            got = await self._cache.get_many(requests, load)
        except BaseException:
            state.held.difference_update(new_holds)
            raise
        self._miss_count += got.miss_count
        self._hit_count += got.hit_count
        return CacheReadOfBlocks(got.values, got.miss_count)

    async def _load(self, refs: Sequence[BlockRef]) -> list[DataBlock]:
        """Fetch blocks with merged GETs: runs of consecutive blocks of one object, each GET at most
        MERGED_GET_MAX_BYTES, all GETs concurrent. Results in the order of ``refs``."""
        runs = merged_runs(refs)

        async def fetch(run: list[int]) -> list[DataBlock]:
            first = refs[run[0]]
            try:
                reader = await self._readers.get(first.key, first.object_size_bytes)
                return await reader.read_blocks([refs[i].entry for i in run], decode=False)
            except NotFoundError as exc:
                self._readers.invalidate(first.key)
                raise _ObjectGoneError(f"object {first.key} is gone") from exc

        results = await asyncio.gather(*(fetch(run) for run in runs))
        out: list[DataBlock | None] = [None] * len(refs)
        for run, blocks in zip(runs, results, strict=True):
            for i, block in zip(run, blocks, strict=True):
                out[i] = block
        return [b for b in out if b is not None]

    # -- readahead --------------------------------------------------------------------------
    def _maybe_readahead(self, state: ReadState, miss_count: int, consumer_offset: int | None = None) -> None:
        if not self._readahead.enabled or self._closed:
            return
        size_bytes = readahead_size(
            state,
            self._readahead,
            miss_count=miss_count,
            evicted_unread_count=self._cache.evicted_unread_count,
            cache_free_bytes=self._cache.free_bytes,
            now_s=self._clock(),
            consumer_offset=consumer_offset,
        )
        if not size_bytes:
            return
        self._readahead_count += 1
        state.readahead_tasks.add(
            asyncio.create_task(self._run_readahead(state, size_bytes), name=f"readahead-{state.stream_id}")
        )

    def _readahead_past(self, state: ReadState, refs: Sequence[BlockRef]) -> int:
        """A read about to load blocks itself (cold data) starts readahead beyond them now, so the
        next GETs overlap its own instead of starting after it returns. Returns the block misses
        this accounted for (the read's growth of the readahead counts them once)."""
        if not self._readahead.enabled or self._closed:
            return 0
        load_count = sum(1 for r in refs if not self._cache.stored_or_loading(r.cache_key))
        if load_count:
            read_end = refs[-1].entry.end_offset
            state.readahead_end_offset = max(state.readahead_end_offset, read_end)
            self._maybe_readahead(state, load_count, consumer_offset=read_end)
        return load_count

    def _prefetch_next_objects(self, state: ReadState) -> None:
        """Once readahead is within one readahead window of the window's end, open the objects after
        the window in the background, so the extension that follows finds their indexes ready instead
        of stalling the reader (and its readahead) on their tail GETs."""
        window_end = state.window_end
        if not state.window or state.objects_prefetched_to >= window_end:
            return
        left_bytes = sum(
            r.entry.size_bytes for r in state.window if r.entry.start_offset >= state.readahead_end_offset
        )
        if left_bytes > state.readahead_bytes:
            return
        state.objects_prefetched_to = window_end
        state.readahead_tasks.add(
            asyncio.create_task(
                self._prefetch_objects(state.stream_id, window_end), name=f"prefetch-{state.stream_id}"
            )
        )

    async def _prefetch_objects(self, stream_id: StreamId, start_offset: int) -> None:
        with contextlib.suppress(S3StreamError):  # best effort: the extension meets any error itself
            slices = await self._metadata.get_objects(
                stream_id=stream_id, start_offset=start_offset, end_offset=-1, limit=GET_OBJECTS_STEP
            )
            for object_slice in slices:
                key = object_key(object_slice.object_id, self._namespace)
                self._readers.prefetch(key, object_slice.size_bytes)

    async def _run_readahead(self, state: ReadState, size_bytes: int) -> None:
        """Load blocks from the readahead mark (or the consumer's position) for ``size_bytes``."""
        with contextlib.suppress(_ObjectGoneError, S3StreamError):
            # Best effort: the consumer's own read meets and reports the same errors.
            async with state.lock:  # plan under the lock so concurrent readaheads take disjoint blocks
                start = max(state.next_offset, state.readahead_end_offset)
                await self._blocks_for_locked(state, start, _UNBOUNDED, size_bytes)  # the window covers them
                guard_bytes = self._readahead.free_guard_bytes or 0
                refs = plan_load(
                    size_bytes,
                    [r for r in state.window if r.entry.start_offset >= start],
                    room_bytes=self._cache.free_bytes - guard_bytes,
                )
                if refs:
                    state.readahead_end_offset = refs[-1].entry.end_offset
                    self._prefetch_next_objects(state)
            if refs:
                if not state.dropped:
                    self._maybe_readahead(state, 0)  # the next load plans now: loads overlap in order
                # one cache request per merged GET: its blocks are readable as soon as that GET is in
                results = await asyncio.gather(
                    *(self._get_blocks(state, [refs[i] for i in run]) for run in merged_runs(refs)),
                    return_exceptions=True,
                )
                for result in results:
                    if isinstance(result, BaseException):
                        raise result
                if not state.dropped:
                    self._maybe_readahead(state, 0)  # keep the pipeline full while the consumer works


@dataclass(frozen=True, slots=True)
class CacheReadOfBlocks:
    values: list[DataBlock]
    miss_count: int


def _needs_hold(state: ReadState, key: BlockKey, cache: BlockCache[DataBlock]) -> bool:
    """A state holds each block once; a held block that was evicted since is held again when reloaded."""
    return key not in state.held or not cache.stored_or_loading(key)
