"""Where the engine and compaction crash tests keep their objects and how their WAL writes.

Both are read from the environment so the test and its child processes agree:
``S3STREAM_CRASH_BUCKET_URI`` (set by the ``crash_bucket`` fixture when ``S3STREAM_CRASH_S3=1``: a fresh
prefix on the S3 test server; unset: the data dir's local object store) and ``S3STREAM_CRASH_WAL_AIO``
(the WAL write path, ``s3.wal.aio``: adaptive (the default), off, auto, uring); ``S3STREAM_CRASH_SMALL_WAL=1``
(set by the small-WAL chain of the engine crash test: a 4 MiB WAL and uploads at 2 MiB or every 2 s,
so that the WAL wraps often and fills: appends then wait for a trim and are written again).
"""

from __future__ import annotations

import os
from typing import Literal, cast

from s3stream.config import Config

BUCKET_URI_ENV = "S3STREAM_CRASH_BUCKET_URI"
WAL_AIO_ENV = "S3STREAM_CRASH_WAL_AIO"
SMALL_WAL_ENV = "S3STREAM_CRASH_SMALL_WAL"


def bucket_uri() -> str | None:
    """The bucket URI the crash tests' engines use, or None for the data dir's local object store."""
    return os.environ.get(BUCKET_URI_ENV) or None


def engine_config(config: Config) -> Config:
    """``config`` with the WAL write path of ``S3STREAM_CRASH_WAL_AIO`` and the small WAL of
    ``S3STREAM_CRASH_SMALL_WAL`` (each unchanged when unset)."""
    if os.environ.get(SMALL_WAL_ENV) == "1":
        config = config.replace(
            wal_capacity_bytes=4 << 20, wal_upload_threshold_bytes=2 << 20, wal_upload_interval_ms=2000
        )
    aio = os.environ.get(WAL_AIO_ENV)
    if not aio:
        return config
    if aio not in ("adaptive", "off", "auto", "uring"):
        raise ValueError(f"{WAL_AIO_ENV}={aio!r}: expected adaptive, off, auto or uring")
    return config.replace(wal_aio=cast(Literal["auto", "uring", "adaptive", "off"], aio))


def iterations(name: str, default: int) -> int:
    """An iteration count from the environment variable ``name`` (CI uses ``default``)."""
    return int(os.environ.get(name, str(default)))
