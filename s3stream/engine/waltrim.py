"""Which WAL records may be trimmed: the engine's bookkeeping of records not yet in object storage.

Every WAL record the engine writes gets a submission sequence number (``seq``); WAL offsets grow
with it. A record is *live* from submission until every batch it holds is committed to object
storage (a record whose batches land in different LogCache blocks needs every one of those blocks
committed). The WAL may be trimmed below the oldest live record; if that record's append is still in
flight (its offset is not known yet) nothing is trimmed until the next commit. Pure: no I/O, no clock.

The state is three ``dict[int, int]``: dicts holding only ints are not tracked by the garbage
collector, so a LogCache full of records does not lengthen full collections (one object per
record would: they are the engine's append latency tail).
"""

from __future__ import annotations

from collections.abc import Iterable


class WalTrimTracker:
    """Live WAL records by seq (oldest first) and the bytes they hold."""

    __slots__ = ("_batches", "_last_seq", "_offsets", "_sizes", "end_offset", "live_bytes")

    def __init__(self) -> None:
        self._sizes: dict[int, int] = {}
        """seq -> body bytes of every live record; dicts keep insertion order and seqs only grow, so
        the first entry is the oldest live record."""
        self._offsets: dict[int, int] = {}
        """seq -> WAL offset of the live records whose append completed (none while in flight)."""
        self._batches: dict[int, int] = {}
        """seq -> batches (or KV entries) of the record not yet committed (applied), for records that
        hold more than one; a live record missing here holds one (most do: a plain append)."""
        self._last_seq = -1
        self.live_bytes = 0
        """Body bytes of live records: what the WAL must still hold (back-pressure counts it)."""
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

    def submitted_one(self, seq: int, size_bytes: int) -> None:
        """:meth:`submitted` of a record of one batch whose append is in flight: the append hot path,
        with nothing but the two updates (its ``seq`` comes from the same growing counter)."""
        self._sizes[seq] = size_bytes
        self.live_bytes += size_bytes

    def written(self, offset: int, seq: int = -1) -> None:
        """A record is durable at ``offset`` (``seq``: the live record it is, if any)."""
        if seq in self._sizes:
            self._offsets[seq] = offset
        if offset >= self.end_offset:
            self.end_offset = offset + 1

    def failed(self, seq: int) -> None:
        """The record's append failed: it holds nothing to keep."""
        size = self._sizes.pop(seq, None)
        if size is not None:
            self._offsets.pop(seq, None)
            self._batches.pop(seq, None)
            self.live_bytes -= size

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

    def trim_point(self) -> int | None:
        """The WAL offset below which nothing is live (None: nothing can be trimmed now)."""
        if not self._sizes:
            return self.end_offset if self.end_offset > 0 else None
        return self._offsets.get(next(iter(self._sizes)))  # None: the oldest is in flight
