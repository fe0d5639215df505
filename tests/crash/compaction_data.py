"""Shared by the compaction crash test and its runner: the config and the deterministic payloads."""

from __future__ import annotations

from tests.support.configs import small_config

CONFIG = small_config(
    record_max_bytes=256 << 10,
    wal_upload_interval_ms=3_600_000,
    upload_retry_backoff_ms=10,
    upload_retry_backoff_max_ms=100,
    object_prepared_ttl_ms=3000,
    object_delete_retention_minutes=0,
    object_block_size_bytes=4 << 10,
    stream_object_split_size_bytes=24 << 10,
    stream_set_object_compaction_cache_size_bytes=1 << 20,
    stream_set_object_compaction_stream_split_size_bytes=16 << 10,
)


def payload(stream_id: int, base: int, count: int, size: int) -> bytes:
    head = f"{stream_id}/{base}/{count}/".encode()
    return (head * (size // len(head) + 1))[:size]
