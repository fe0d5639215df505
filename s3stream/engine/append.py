"""The append path: admission under back-pressure, one WAL record per append, acknowledgement in order.

An append (one batch, or an atomic group of batches and KV puts) takes its offsets from its streams
without awaiting in between, so offsets follow submission order; it becomes ONE WAL record; once
durable, the per-stream sequencer (:mod:`s3stream.engine.sequencer`) releases it into the LogCache in
offset order and acknowledges it (an atomic group in all its streams at once, or, if it fails, in none:
every stream it touches is fenced). A conditional append (expected base offsets) is refused with
ConflictError, changing nothing, when a stream's next offset differs at the moment offsets are
assigned; the plain single append (``append_one``) has no such check. KV changes are WAL records
too; :mod:`s3stream.engine.kvlog` applies (and acknowledges) them in WAL order, the order recovery
replays them in. When the LogCache or the WAL has no room, appends wait up to
``append_backpressure_wait_ms`` for a commit to free some, then fail with CapacityError: never loss.

Under a node lease (``lease_check``, the node's :meth:`~s3stream.engine.heartbeat.Heartbeat.holds_lease`)
an append is acknowledged only while the lease holds: it is refused before it reaches the WAL once the
lease deadline has passed, and one whose WAL write returns, or whose turn after an earlier append of
its stream comes, after the deadline fails with FencedError(NODE_FENCED) like a failed write (the
engine fences itself). The local deadline is never
later than the store's lease expiry, which a takeover waits for before reading this node's WAL: so every
acknowledged record was durable before anyone else read the WAL.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable, Sequence

from s3stream.config import Config
from s3stream.engine.coalesce import AppendCoalescer, SharedWrite
from s3stream.engine.kvlog import KvApplier, KvEntry, check_wal_key
from s3stream.engine.logcache import CachedBatch, LogCache
from s3stream.engine.pipeline import EngineStats, UploadPipeline
from s3stream.engine.sequencer import fail_group, fail_stream, release_waiting, take_turn
from s3stream.engine.stream import PendingAppend, Status, StreamHandle
from s3stream.engine.supervisor import Supervisor
from s3stream.engine.walbody import KvMutation, KvOp, encode_group, encode_kv, plain_parts
from s3stream.engine.walport import BodyParts, WriteAheadLog, fast_append
from s3stream.engine.waltrim import WalTrimTracker
from s3stream.errors import (
    CapacityError,
    ConflictError,
    ErrorCode,
    FencedError,
    InvalidArgumentError,
    S3StreamError,
    UnavailableError,
)
from s3stream.record import RECORD_HEADER, RECORD_HEADER_SIZE, RECORD_MAGIC, StreamRecordBatch

LATENCY_SAMPLE_MASK = 15
"""With metrics on, the appends whose WAL sequence number at the call is a multiple of 16 are timed:
two clock reads and a histogram update cost ~0.4 us, 2 % of a 1 KiB append's loop CPU if paid by every
append (decision 0060)."""
_perf_counter = time.perf_counter

_pack_header = RECORD_HEADER.pack
_OPEN = Status.OPEN
"""A module constant: ``Status.OPEN`` is an enum class attribute lookup (~45 ns on CPython 3.11)."""

PARTS_MIN_BYTES = 16 * 1024
"""A plain append whose payload has at least this many bytes goes to the WAL as (header, payload)
parts, so the payload is not copied; a smaller one as one joined body. Measured on the block WAL
(1 KiB records, 128 appenders): parts cost its writer ~1.2-2 us more event-loop CPU per record than
one bytes body, while joining a 40-byte header and a payload of up to 16 KiB costs ~0.1-0.2 us (64
KiB: ~2 us, more than the parts do)."""

WAL_ROOM_FRACTION = 0.9
"""Share of the WAL capacity that records awaiting upload may hold before appends wait."""


def check_expected_offsets(
    appends: Sequence[tuple[StreamHandle, bytes, int]], expected_offsets: Sequence[int | None]
) -> None:
    """ConflictError unless every entry would get its expected base offset (None: any); changes nothing.

    Entries of one stream follow each other: the second's base is the first's plus its count.
    """
    if len(expected_offsets) != len(appends):
        raise InvalidArgumentError(f"{len(expected_offsets)} expected offsets for {len(appends)} appends")
    next_offsets: dict[StreamHandle, int] = {}
    for (handle, _, count), expected in zip(appends, expected_offsets, strict=True):
        base = next_offsets.get(handle, handle.next_offset)
        if expected is not None and expected != base:
            raise ConflictError(
                f"stream {handle.stream_id}: append expected at offset {expected}, but the stream's "
                f"next offset is {base}; nothing was appended"
            )
        next_offsets[handle] = base + count


class AppendPath:
    """Appends of every open stream of one engine: offsets, WAL writes, ordered acknowledgements."""

    def __init__(
        self,
        config: Config,
        *,
        cache: LogCache,
        wal: WriteAheadLog,
        kv: KvApplier,
        trim_tracker: WalTrimTracker,
        pipeline: UploadPipeline,
        supervisor: Supervisor,
        stats: EngineStats,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.cache = cache
        self.wal = wal
        self.kv = kv
        self.trim_tracker = trim_tracker
        self.pipeline = pipeline
        self.supervisor = supervisor
        self.stats = stats
        self.clock = clock
        self.wal_room_bytes = int(config.wal_capacity_bytes * WAL_ROOM_FRACTION)
        self.record_max_bytes = config.record_max_bytes
        self._wal_append, self._translate_wal_error = fast_append(wal)
        self._seq = 0
        self.coalescer: AppendCoalescer | None = None
        """Plain appends below :data:`PARTS_MIN_BYTES` share one WAL record per loop turn (decision 0066)
        where the WAL's append submits in call order (the block WAL's; None: each its own record)."""
        if self._translate_wal_error is not None:
            self.coalescer = AppendCoalescer(
                wal_append=self._wal_append,
                trim_tracker=trim_tracker,
                next_seq=self._take_seq,
                record_max_bytes=config.wal_record_max_bytes,
                before_write=self._lease_error,
            )
        self._watched: tuple[int, float] | None = None
        """(seq, time first seen) of the oldest WAL append in flight at the last watchdog pass."""
        self.lease_check: Callable[[], bool] | None = None
        """The node lease: False once its deadline has passed (None: no lease, an embedded engine)."""
        self.latency: Callable[[float], None] | None = None
        """Told the seconds of one append in :data:`LATENCY_SAMPLE_MASK` + 1, from the call to its
        acknowledgement (metrics); None: no append is timed."""

    def lease_lost(self) -> FencedError:
        """The lease check failed: the engine is fenced (once); returns the error appends fail with."""
        supervisor = self.supervisor
        if supervisor.failed is None:
            supervisor.fail(FencedError("the node's lease has ended: appends are no longer acknowledged",
                                        code=ErrorCode.NODE_FENCED))  # fmt: skip
        failed = supervisor.failed
        return (
            failed
            if isinstance(failed, FencedError)
            else FencedError(str(failed), code=ErrorCode.NODE_FENCED)
        )

    def _lease_error(self) -> FencedError | None:
        """The error of a write about to start or that returned after the lease deadline (None: the
        lease holds)."""
        lease = self.lease_check
        if lease is not None and not lease():
            return self.lease_lost()
        return None

    def next_seq(self) -> int:
        """The next WAL record's submission sequence number (seqs grow with WAL offsets): the open
        coalesced record, which has an earlier one, is submitted first."""
        if self.coalescer is not None:
            self.coalescer.flush()
        return self._take_seq()

    def _take_seq(self) -> int:
        seq = self._seq
        self._seq = seq + 1
        return seq

    async def append(
        self,
        appends: Sequence[tuple[StreamHandle, bytes, int]],
        kv_puts: Sequence[tuple[str, bytes]] = (),
        expected_offsets: Sequence[int | None] | None = None,
    ) -> list[int]:
        """Append ``(stream, payload, count)`` entries (and KV puts) as ONE WAL record.

        Returns the base offsets; returns once the record is durable, every earlier append of the same
        streams is acknowledged and the KV puts (after every earlier KV change) are in metadata.
        ``expected_offsets`` (one per entry, None: any) makes the append conditional: an entry whose
        base offset would differ fails the whole call with ConflictError before anything is assigned
        or written (checked with the offsets' assignment, no await in between).
        """
        if len(appends) == 1 and not kv_puts and expected_offsets is None:
            handle, payload, count = appends[0]
            return [await self.append_one(handle, payload, count)]
        latency = self.latency
        started = _perf_counter() if latency is not None and not self._seq & LATENCY_SAMPLE_MASK else 0.0
        try:
            supervisor = self.supervisor
            if supervisor.failed is not None or supervisor.closed:
                supervisor.check_alive()
            lease = self.lease_check
            if lease is not None and not lease():
                raise self.lease_lost()
            size = 0
            record_max = self.config.record_max_bytes
            for handle, payload, _ in appends:
                if handle.status is not Status.OPEN:
                    handle.check_writable()
                if len(payload) > record_max:
                    raise InvalidArgumentError(
                        f"record batch of {len(payload)} bytes is above s3.record.size.max ({record_max})"
                    )
                size += len(payload)
            for key, value in kv_puts:
                check_wal_key(key)
                size += len(key) + len(value)
            if not self._has_room(size):
                await self._admit(size)
                for handle, _, _ in appends:
                    handle.check_writable()
            # No await from here until the WAL write: offsets are assigned in submission order.
            if expected_offsets is not None:
                check_expected_offsets(appends, expected_offsets)
            by_stream: dict[StreamHandle, list[CachedBatch]] = {}
            bases = []
            for handle, payload, count in appends:
                base = handle.next_offset
                handle.next_offset += count
                by_stream.setdefault(handle, []).append(
                    CachedBatch(handle.stream_id, handle.epoch, base, count, bytes(payload))
                )
                bases.append(base)
            body = encode_group(
                [StreamRecordBatch(*i) for items in by_stream.values() for i in items], kv_puts
            )
            record_count = len(appends)
            if len(body) > self.config.wal_record_max_bytes:
                for handle, _, count in reversed(appends):
                    handle.next_offset -= count
                raise InvalidArgumentError(
                    f"WAL record of {len(body)} bytes is above s3.wal.record.size.max "
                    f"({self.config.wal_record_max_bytes})"
                )
            seq = self.next_seq()
            pending = PendingAppend(seq, by_stream, remaining=len(by_stream))
            kv_entry = None
            if kv_puts:
                kv_entry = self.kv.submit(seq, [KvMutation(KvOp.PUT, k, v) for k, v in kv_puts])
            live_count = record_count + (1 if kv_entry is not None else 0)
            if live_count:
                self.trim_tracker.submitted(seq, batch_count=live_count, size_bytes=len(body))
            offset = await self._write(body, pending, by_stream, kv_entry)
            self.trim_tracker.written(offset, seq)
            pending.persisted = True
            if kv_entry is not None:
                self.kv.persisted(kv_entry, offset)
            failure = next((h.append_failure for h in by_stream if h.append_failure is not None), None)
            if failure is not None:
                fail_group(pending, failure, self.trim_tracker)  # a stream failed while it was in flight
            else:
                for handle, items in by_stream.items():
                    take_turn(handle, pending, items[0].base_offset, self._put, self.trim_tracker)
            await pending.outcome()
            if kv_entry is not None:
                await kv_entry.future
            if lease is not None and not lease():  # its turn came after the deadline (a paused process)
                raise self.lease_lost()
            stats = self.stats
            stats.appended_records += record_count
            stats.appended_bytes += size
            if started and latency is not None:
                latency(_perf_counter() - started)
            return bases
        except BaseException:
            self.stats.append_errors += len(appends)
            raise

    async def append_one(self, handle: StreamHandle, payload: bytes, count: int) -> int:
        """One batch to one stream: :meth:`append`'s common case, written for speed (it runs once per
        record batch): released in line when its base offset is its stream's confirm offset once
        durable (see :mod:`s3stream.engine.sequencer`), with no future of its own, no PendingAppend,
        no queue entry; the trim tracker's and the LogCache's bookkeeping stay theirs (one call each:
        :meth:`WalTrimTracker.write_started`, :meth:`~WalTrimTracker.write_returned`,
        :meth:`LogCache.put_plain`)."""
        latency = self.latency
        started = _perf_counter() if latency is not None and not self._seq & LATENCY_SAMPLE_MASK else 0.0
        try:
            supervisor = self.supervisor
            if handle.status is not _OPEN or supervisor.failed is not None or supervisor.closed:
                supervisor.check_alive()
                handle.check_writable()
            size = len(payload)
            coalescer = self.coalescer
            lease = self.lease_check
            if (
                lease is not None
                and (coalescer is None or coalescer.open_seq < 0 or size >= PARTS_MIN_BYTES)
                and not lease()
            ):  # an append joining the open coalesced record is checked with it, before it is written
                raise self.lease_lost()
            if size > self.record_max_bytes:
                raise InvalidArgumentError(
                    f"record batch of {size} bytes is above s3.record.size.max ({self.record_max_bytes})"
                )
            cache = self.cache
            trim_tracker = self.trim_tracker
            if (
                cache.size_bytes + size > cache.capacity_bytes
                or trim_tracker.live_bytes + size > self.wal_room_bytes
            ):
                await self._admit(size)
                handle.check_writable()
            # No await from here until the WAL write: offsets are assigned in submission order.
            base = handle.next_offset
            handle.next_offset = end = base + count
            stream_id = handle.stream_id
            epoch = handle.epoch
            body_bytes = RECORD_HEADER_SIZE + size
            # The body is StreamRecordBatch.encode()'s bytes (header packed here, see walbody.plain_parts):
            # joined when small (into the turn's coalesced record where there is one), as (header,
            # payload) parts otherwise (see PARTS_MIN_BYTES).
            header = _pack_header(RECORD_MAGIC, stream_id, epoch, base, count, size)
            write: SharedWrite | None = None
            if coalescer is not None and size < PARTS_MIN_BYTES:
                seq, write = coalescer.add(header, payload, body_bytes)
                trim_tracker.live_bytes += body_bytes  # a per-block record once released
            else:
                if coalescer is not None:
                    coalescer.flush()
                seq = self._seq
                self._seq = seq + 1
                trim_tracker.write_started(seq, body_bytes)  # a per-block record once released
            try:
                if write is not None:
                    offset = await write
                else:
                    offset = await self._wal_append(
                        header + payload if size < PARTS_MIN_BYTES else (header, payload)
                    )
                # Durable after the deadline: never acknowledged. Checked here, in the appender's own
                # turn, even when the coalesced record was checked as its write returned: the process
                # may pause between that callback and this task's wake-up (a SIGSTOP past the lease).
                if lease is not None and not lease():
                    raise self.lease_lost()
            except BaseException as exc:  # noqa: BLE001 - _after_failed_write re-raises all but a full WAL
                if self._translate_wal_error is not None:
                    exc = self._translate_wal_error(exc)
                body = plain_parts(stream_id, epoch, base, count, payload)
                pending = PendingAppend(seq, None, 1)
                try:
                    offset = await self._after_failed_write(exc, body, pending, (handle,), None, body_bytes)
                except BaseException:
                    if write is None:  # a coalesced record's write returned once, for all of its appends
                        trim_tracker.write_returned(seq)
                    raise
                if write is not None:  # written again on its own (a full WAL): its offset
                    trim_tracker.written(offset)
            if write is None:
                trim_tracker.write_returned(seq, offset)
            if base == handle.confirm_offset and handle.append_failure is None:
                # Its stream's next append to release (the usual case): released right here, in line,
                # as a per-block record of the trim tracker (the block keeps its WAL offset).
                if cache.put_plain(stream_id, epoch, base, count, payload, offset):
                    self.pipeline.archive_and_upload()
                handle.confirm_offset = end
                if handle.waiting:  # later appends that completed first wait for this one
                    release_waiting(handle, self._put, trim_tracker)
            else:
                item = CachedBatch(stream_id, epoch, base, count, payload)
                await self._wait_turn(handle, seq, item, offset)
                # Its turn can come after the deadline (the process paused while it waited for an
                # earlier append of its stream): then it is not acknowledged either.
                if lease is not None and not lease():
                    raise self.lease_lost()
            stats = self.stats
            stats.appended_records += 1
            stats.appended_bytes += size
            if started and latency is not None:
                latency(_perf_counter() - started)
            return base
        except BaseException:
            self.stats.append_errors += 1
            raise

    async def append_kv(self, mutation: KvMutation) -> bytes | None:
        """One KV change as its own WAL record; returns once it (and every earlier one) is in metadata."""
        self.supervisor.check_alive()
        lease = self.lease_check
        if lease is not None and not lease():
            raise self.lease_lost()
        check_wal_key(mutation.key)
        size = len(mutation.key) + len(mutation.value)
        if not self._has_room(size):
            await self._admit(size)
        body = encode_kv([mutation])
        if len(body) > self.config.wal_record_max_bytes:
            raise InvalidArgumentError(
                f"KV change of {len(body)} bytes is above s3.wal.record.size.max "
                f"({self.config.wal_record_max_bytes})"
            )
        seq = self.next_seq()
        kv_entry = self.kv.submit(seq, [mutation])
        self.trim_tracker.submitted(seq, batch_count=1, size_bytes=len(body))
        offset = await self._write(body, PendingAppend(seq, {}, 0), (), kv_entry)
        self.trim_tracker.written(offset, seq)
        self.kv.persisted(kv_entry, offset)
        (result,) = await kv_entry.future
        return result

    async def _wait_turn(self, handle: StreamHandle, seq: int, item: CachedBatch, offset: int) -> None:
        """A durable plain append whose stream has an earlier append in flight (or whose appends
        failed): it waits for its turn as a :class:`PendingAppend`, held by the trim tracker."""
        failure = handle.append_failure
        if failure is not None:
            self.trim_tracker.failed(seq, RECORD_HEADER_SIZE + len(item.payload))  # nothing to keep
            raise failure
        pending = PendingAppend(seq, None, 1, item)
        pending.persisted = True
        self.trim_tracker.hold(seq, offset)
        handle.waiting[item.base_offset] = pending
        await pending.outcome()

    def _put(self, item: CachedBatch, seq: int, wal_offset: int) -> None:
        """An acknowledged batch enters the active LogCache block (archived and uploaded once full):
        with its WAL record's ``seq`` (a per-record entry of the trim tracker) or its ``wal_offset``
        (a plain append: per block)."""
        if self.cache.put_item(item, seq, wal_offset):
            self.pipeline.archive_and_upload()

    def _has_room(self, size_bytes: int) -> bool:
        return (
            self.cache.size_bytes + size_bytes <= self.cache.capacity_bytes
            and self.trim_tracker.live_bytes + size_bytes <= self.wal_room_bytes
        )

    async def _admit(self, size_bytes: int) -> None:
        """Wait for room in the LogCache and the WAL; CapacityError after the configured wait. An
        admission that has to wait counts once in ``backpressure_waits`` (and its wait's seconds)."""
        deadline = self.clock() + self.config.append_backpressure_wait_ms / 1000
        room = self.pipeline.room
        waited_from: float | None = None
        try:
            while True:
                self.supervisor.check_alive()
                if self.cache.has_room(size_bytes) and (
                    self.trim_tracker.live_bytes + size_bytes <= self.wal_room_bytes
                    or self.trim_tracker.live_bytes == 0
                ):
                    return
                self.pipeline.upload_for_room()
                now = self.clock()
                remaining = deadline - now
                if remaining <= 0:
                    self.stats.backpressure_rejections += 1
                    raise CapacityError(
                        f"no room: LogCache {self.cache.size_bytes}/{self.cache.capacity_bytes} bytes, WAL "
                        f"{self.trim_tracker.live_bytes}/{self.config.wal_capacity_bytes} bytes awaiting "
                        f"upload ({self.pipeline.failure_hint()}); back off and retry"
                    )
                if waited_from is None:
                    waited_from = now
                    self.stats.backpressure_waits += 1
                room.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(room.wait(), timeout=min(remaining, 0.1))
        finally:
            if waited_from is not None:
                self.stats.backpressure_wait_s += self.clock() - waited_from

    async def _write(
        self,
        body: BodyParts,
        pending: PendingAppend,
        handles: Iterable[StreamHandle],
        kv_entry: KvEntry | None,
    ) -> int:
        """The WAL write of a record with a per-record trim entry (``append_one`` writes its own)."""
        trim_tracker = self.trim_tracker
        trim_tracker.write_started(pending.seq)  # its floor; the watchdog's view
        offset = -1
        lease = self.lease_check
        if self.coalescer is not None:
            self.coalescer.flush()  # its seq is below this record's
        try:
            offset = await self.wal.append(body)
            if lease is not None and not lease():  # durable after the deadline: never acknowledged
                offset = -1
                raise self.lease_lost()
        except BaseException as exc:  # noqa: BLE001 - _after_failed_write re-raises all but a full WAL
            offset = await self._after_failed_write(exc, body, pending, handles, kv_entry)
        finally:
            trim_tracker.write_returned(pending.seq, offset)
        return offset

    async def _after_failed_write(
        self,
        exc: BaseException,
        body: BodyParts,
        pending: PendingAppend,
        handles: Iterable[StreamHandle],
        kv_entry: KvEntry | None,
        plain_bytes: int = 0,
    ) -> int:
        """A WAL write raised ``exc``: a full WAL is retried as commits trim it (up to the back-pressure
        wait); any other failure fences the append's streams, cancels its KV changes and raises.
        ``plain_bytes``: a plain append's body bytes (counted at submission, no per-record entry)."""
        try:
            if not isinstance(exc, CapacityError):
                raise exc
            return await self._retry_when_trimmed(body)
        except BaseException as failure:
            if kv_entry is not None:
                self.kv.failed(kv_entry)
            error = (
                failure
                if isinstance(failure, S3StreamError)
                else UnavailableError(f"append interrupted: {failure!r}")
            )
            self._append_failed(pending, handles, error, plain_bytes)
            raise

    async def _retry_when_trimmed(self, body: BodyParts) -> int:
        """The WAL was full: start uploads and trims, and write again as room appears."""
        deadline = self.clock() + self.config.append_backpressure_wait_ms / 1000
        room = self.pipeline.room
        while True:
            self.pipeline.upload_for_room()
            self.pipeline.trim_wal()  # KV records applied since the last commit
            room.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(room.wait(), timeout=0.1)
            self.supervisor.check_alive()
            if self.coalescer is not None:
                self.coalescer.flush()
            try:
                return await self.wal.append(body)
            except CapacityError:
                if self.clock() >= deadline:
                    raise

    def watchdog(self) -> None:
        """AutoMQ's WAL append timeout: an append in flight for longer fails the engine.

        Called every tick: the oldest append in flight is timed from the first tick that saw it, so a
        stuck append fails the engine between the timeout and the timeout plus one tick after it began.
        """
        in_wal = self.trim_tracker.inflight
        if not in_wal:
            self._watched = None
            return
        oldest = next(iter(in_wal))
        now = self.clock()
        watched = self._watched
        if watched is None or watched[0] != oldest:
            self._watched = (oldest, now)
            return
        timeout_s = self.config.wal_append_timeout_ms / 1000
        if now - watched[1] > timeout_s:
            self.supervisor.fail(UnavailableError(f"a WAL append did not complete within {timeout_s} s"))
            self.supervisor.spawn(self.wal.close(), name="s3stream-wal-close-after-timeout")

    def _append_failed(
        self,
        pending: PendingAppend,
        handles: Iterable[StreamHandle],
        error: S3StreamError,
        plain_bytes: int = 0,
    ) -> None:
        """Any append failure fences its streams (AutoMQ): later appends of them fail too."""
        self.trim_tracker.failed(pending.seq, plain_bytes)
        fence = (
            error
            if isinstance(error, FencedError)
            else FencedError(f"stream fenced after a failed append: {error}")
        )
        for handle in handles:
            handle.fence(fence)
            fail_stream(handle, fence, self.trim_tracker)
        self.pipeline.room.set()
