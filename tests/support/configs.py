"""The small engine configuration engine tests start from: a WAL, caches and uploads of a few MiB.

Tests change only what they are about (``small_config(wal_upload_interval_ms=60_000)``), so the
values a test depends on stand in the test.
"""

from __future__ import annotations

from typing import Any

from s3stream.config import Config

KiB = 1 << 10
MiB = 1 << 20

SMALL = Config(
    wal_capacity_bytes=8 * MiB,
    wal_record_max_bytes=1 * MiB,
    record_max_bytes=512 * KiB,
    wal_cache_size_bytes=4 * MiB,
    wal_upload_threshold_bytes=1 * MiB,
)
"""An 8 MiB WAL of records up to 1 MiB (record batches up to 512 KiB), a 4 MiB LogCache, uploads at 1 MiB."""


def small_config(**changes: Any) -> Config:
    """:data:`SMALL` with ``changes`` (``Config`` field names), validated again."""
    return SMALL.replace(**changes)
