"""The small engine configuration engine tests start from: a WAL, caches and uploads of a few MiB.

Tests change only what they are about (``small_config(wal_upload_interval_ms=60_000)``), so the
values a test depends on stand in the test.
"""

from __future__ import annotations

from pathlib import Path
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


SMALL_TOML = """
"s3.wal.capacity" = "16MiB"
"s3.wal.record.size.max" = "1MiB"
"s3.record.size.max" = "512KiB"
"s3.wal.cache.size" = "8MiB"
"s3.wal.upload.threshold" = "1MiB"
"s3.block.cache.size" = "4MiB"
"""
"""The small configuration as a TOML file for the CLI (``--config``): a 16 MiB WAL, uploads at 1 MiB."""


def cli_data_dir_args(tmp_path: Path, toml: str = SMALL_TOML) -> list[str]:
    """``--data-dir <tmp>/data --config <tmp>/s3stream.toml`` with ``toml`` written to the file."""
    config = tmp_path / "s3stream.toml"
    config.write_text(toml)
    return ["--data-dir", str(tmp_path / "data"), "--config", str(config)]
