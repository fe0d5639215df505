"""Which WAL records may be trimmed: the engine's bookkeeping of records not yet in object storage.

Every WAL record the engine writes gets a submission sequence number (``seq``); WAL offsets grow
with it. A record is *live* from submission until every batch it holds is committed to object
storage (a record whose batches land in different LogCache blocks needs every one of those blocks
committed). The WAL may be trimmed below the oldest live record. Pure: no I/O, no clock.

Live records are known in three ways (the trim point is the lowest offset any of them allows):

- **in flight** (``inflight``: seq -> floor): an append whose WAL write has not returned. Its offset
  is not known yet, but it is at least its *floor*, the tracker's ``end_offset`` when it was
  submitted: every record whose write had returned by then was written by an earlier WAL call, and
  WAL offsets grow with call order. Floors grow with seqs, so the oldest entry's is the lowest.
- **per block** (the common plain append, released into the LogCache as soon as it is durable): the
  LogCache block it lands in keeps the lowest WAL offset and the body bytes of such records
  (``LogCacheBlock.wal_offset_min``, ``wal_bytes``); they stay live until the block is committed.
  The caller passes the lowest such offset over uncommitted blocks to :meth:`trim_point`.
- **held** (``seq`` -> offset): a durable plain append the sequencer holds back behind an earlier
  append of its stream still in flight; it becomes a per-block record once released (:meth:`unhold`).
- **per record** (``seq`` -> size, offset, batches left): atomic groups, KV records and replayed
  records; the LogCache block keeps their seqs and reports each batch committed (:meth:`committed`).

The state is ``dict[int, int]`` only: dicts holding only ints are not tracked by the garbage
collector, so a LogCache full of records does not lengthen full collections (one object per
record would: they are the engine's append latency tail).
"""

from __future__ import annotations

from collections.abc import Iterable


class WalTrimTracker:
    """Live WAL records by seq (oldest first) and the bytes they hold."""

    __slots__ = (
        "_batches",
        "_held",
        "_held_more",
        "_last_seq",
        "_offsets",
        "_sizes",
        "end_offset",
        "inflight",
        "live_bytes",
    )

    def __init__(self) -> None:
        self._sizes: dict[int, int] = {}
        """seq -> body bytes of every live record; dicts keep insertion order and seqs only grow, so
        the first entry is the oldest live record."""
        self._offsets: dict[int, int] = {}
        """seq -> WAL offset of the live records whose append completed (none while in flight)."""
        self._batches: dict[int, int] = {}
        """seq -> batches (or KV entries) of the record not yet committed (applied), for records that
        hold more than one; a live record missing here holds one (most do: a plain append)."""
        self._held: dict[int, int] = {}
        """seq -> WAL offset of durable plain appends not yet released into the LogCache (few: only
        those that completed before an earlier append of their stream)."""
        self._held_more: dict[int, int] = {}
        """seq -> held appends of the record beyond the first (a coalesced record's appends share its
        seq, :mod:`s3stream.engine.coalesce`): the record stays held until the last is released."""
        self._last_seq = -1
        self.inflight: dict[int, int] = {}
        """seq -> floor of every append whose WAL write has not returned, oldest first: the floor is
        ``end_offset`` at its submission, at most the offset the write will return
        (:meth:`write_started`, :meth:`write_returned`; the append path's watchdog times the oldest)."""
        self.live_bytes = 0
        """Body bytes of live records: what the WAL must still hold (back-pressure counts it).
        :meth:`write_started` adds a plain append's bytes; :meth:`released` takes a committed
        block's back."""
        self.end_offset = 0
        """One past the largest WAL offset seen: trimming here drops every record written so far."""

    def __len__(self) -> int:
        return len(self._sizes)

    def submitted(self, seq: int, *, batch_count: int, size_bytes: int, offset: int = -1) -> None:
        """A record holding ``batch_count`` batches was submitted (``offset`` known: replayed)."""
        assert batch_count > 0
        assert seq > self._last_seq, "seqs must grow"
        assert not self._sizes or seq > next(reversed(self._sizes)), "seqs must grow"
        self._last_seq = seq
        self._sizes[seq] = size_bytes
        if batch_count > 1:
            self._batches[seq] = batch_count
        self.live_bytes += size_bytes
        if offset >= 0:
            self.written(offset, seq)

    def write_started(self, seq: int, plain_bytes: int = 0) -> None:
        """The WAL write of record ``seq`` begins: it is in flight, its floor the current ``end_offset``.

        ``plain_bytes``: a plain append's body bytes, live from now on without a per-record entry
        (a per-block record once released into the LogCache, or :meth:`hold`)."""
        self.live_bytes += plain_bytes
        self.inflight[seq] = self.end_offset

    def write_returned(self, seq: int, offset: int = -1) -> None:
        """The WAL write of record ``seq`` returned: durable at ``offset`` (negative: it failed).

        Only what every write needs (the append hot path calls this once per record); a record with a
        per-record entry also reports its offset with :meth:`written`."""
        del self.inflight[seq]
        if offset >= self.end_offset:
            self.end_offset = offset + 1

    def hold(self, seq: int, offset: int) -> None:
        """A plain append of record ``seq`` (its bytes counted in ``live_bytes`` at submission) is
        durable at ``offset`` but waits for an earlier append of its stream before entering the
        LogCache. Appends of one coalesced record share its seq: each holds it once."""
        if seq in self._held:
            self._held_more[seq] = self._held_more.get(seq, 0) + 1
        else:
            self._held[seq] = offset

    def unhold(self, seq: int) -> int:
        """A held plain append of record ``seq`` enters the LogCache (a per-block record from now on):
        its offset."""
        if self._unhold_more(seq):
            return self._held[seq]
        return self._held.pop(seq)

    def drop_held(self, seq: int, size_bytes: int) -> None:
        """A held plain append of record ``seq`` (``size_bytes`` of body) failed: it holds nothing to keep."""
        if seq not in self._held:
            return
        if not self._unhold_more(seq):
            del self._held[seq]
        self.live_bytes -= size_bytes

    def _unhold_more(self, seq: int) -> bool:
        """One holder of ``seq`` leaves: True while others still hold it."""
        more = self._held_more.get(seq)
        if more is None:
            return False
        if more == 1:
            del self._held_more[seq]
        else:
            self._held_more[seq] = more - 1
        return True

    def released(self, size_bytes: int) -> None:
        """A committed LogCache block's per-block records (``size_bytes`` of bodies) are no longer live."""
        self.live_bytes -= size_bytes

    def written(self, offset: int, seq: int = -1) -> None:
        """A record is durable at ``offset`` (``seq``: the live record it is, if any)."""
        if seq in self._sizes:
            self._offsets[seq] = offset
        if offset >= self.end_offset:
            self.end_offset = offset + 1

    def failed(self, seq: int, plain_bytes: int = 0) -> None:
        """The record's append failed: it holds nothing to keep. ``plain_bytes``: the body bytes of a
        plain append counted at submission without a per-record entry (taken back if it has none)."""
        size = self._sizes.pop(seq, None)
        if size is not None:
            self._offsets.pop(seq, None)
            self._batches.pop(seq, None)
            self.live_bytes -= size
        else:
            self.live_bytes -= plain_bytes

    def committed(self, seqs: Iterable[int]) -> None:
        """One batch of each listed record (a seq once per batch) is now in object storage."""
        sizes = self._sizes
        offsets = self._offsets
        batches = self._batches
        for seq in seqs:
            if seq not in sizes:
                continue
            left = batches.pop(seq, 1)
            if left > 1:
                batches[seq] = left - 1
                continue
            self.live_bytes -= sizes.pop(seq)
            offsets.pop(seq, None)

    def trim_point(self, cached_min: int = -1) -> int | None:
        """The WAL offset below which nothing is live (None: nothing can be trimmed now).

        ``cached_min``: the lowest WAL offset of the per-block records of uncommitted LogCache blocks
        (negative: none)."""
        point = cached_min if cached_min >= 0 else -1
        if self._held:
            held = min(self._held.values())
            point = held if point < 0 else min(point, held)
        if self.inflight:
            floor = next(iter(self.inflight.values()))
            point = floor if point < 0 else min(point, floor)
        if self._sizes:
            oldest = next(iter(self._sizes))
            offset = self._offsets.get(oldest)
            if offset is None:
                if oldest not in self.inflight:
                    return None  # its offset is not known and no floor bounds it
                # In flight: its floor (at least the oldest floor, counted above) bounds it, and every
                # later record's offset is above its own.
            else:
                point = offset if point < 0 else min(point, offset)
        if point >= 0:
            return point
        return self.end_offset if self.end_offset > 0 else None
