"""Which WAL records may be trimmed: the engine's bookkeeping of records not yet in object storage.

Every WAL record the engine writes gets a submission sequence number (``seq``); WAL offsets grow
with it. A record is *live* from submission until every batch it holds is committed to object
storage (a record whose batches land in different LogCache blocks needs every one of those blocks
committed). The WAL may be trimmed below the oldest live record; if that record's append is still in
flight (its offset is not known yet) nothing is trimmed until the next commit. Pure: no I/O, no clock.
"""

from __future__ import annotations


class WalTrimTracker:
    """Live WAL records by seq (oldest first) and the bytes they hold."""

    __slots__ = ("_live", "end_offset", "live_bytes")

    def __init__(self) -> None:
        self._live: dict[int, list[int]] = {}
        """seq -> [WAL offset or -1 while in flight, batches not yet committed, body bytes]; dicts keep
        insertion order and seqs only grow, so the first entry is the oldest."""
        self.live_bytes = 0
        """Body bytes of live records: what the WAL must still hold (back-pressure counts it)."""
        self.end_offset = 0
        """One past the largest WAL offset seen: trimming here drops every record written so far."""

    def __len__(self) -> int:
        return len(self._live)

    def submitted(self, seq: int, *, batch_count: int, size_bytes: int, offset: int = -1) -> list[int]:
        """A record holding ``batch_count`` batches was submitted (``offset`` known: replayed)."""
        assert batch_count > 0
        assert seq not in self._live
        assert not self._live or seq > next(reversed(self._live)), "seqs must grow"
        entry = self._live[seq] = [offset, batch_count, size_bytes]
        self.live_bytes += size_bytes
        if offset >= 0:
            self.written(offset)
        return entry

    def written(self, offset: int) -> None:
        """A record is durable at ``offset`` (set the entry's offset through the returned list)."""
        if offset >= self.end_offset:
            self.end_offset = offset + 1

    def failed(self, seq: int) -> None:
        """The record's append failed: it holds nothing to keep."""
        entry = self._live.pop(seq, None)
        if entry is not None:
            self.live_bytes -= entry[2]

    def committed(self, seqs: list[int]) -> None:
        """One batch of each listed record (a seq once per batch) is now in object storage."""
        live = self._live
        for seq in seqs:
            entry = live.get(seq)
            if entry is None:
                continue
            entry[1] -= 1
            if entry[1] == 0:
                del live[seq]
                self.live_bytes -= entry[2]

    def trim_point(self) -> int | None:
        """The WAL offset below which nothing is live (None: nothing can be trimmed now)."""
        if not self._live:
            return self.end_offset if self.end_offset > 0 else None
        offset = self._live[next(iter(self._live))][0]
        return offset if offset >= 0 else None
