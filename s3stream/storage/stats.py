"""Per-operation request counters kept by the storage backends (read by tests and benchmarks)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class StorageStats:
    """How many requests of each kind a backend issued, and how many payload bytes they moved.

    Operation names: ``put``, ``get``, ``head``, ``delete`` (one per batch request), ``list`` (one per
    page), ``copy`` (server-side or read-and-write range copies), and for S3 also
    ``create_multipart``, ``upload_part``, ``upload_part_copy``, ``complete_multipart``,
    ``abort_multipart``, ``retry`` (attempts beyond the first).
    """

    counts: Counter[str] = field(default_factory=Counter)
    bytes: Counter[str] = field(default_factory=Counter)

    def record(self, op: str, size_bytes: int = 0) -> None:
        self.counts[op] += 1
        if size_bytes:
            self.bytes[op] += size_bytes

    def reset(self) -> None:
        self.counts.clear()
        self.bytes.clear()
