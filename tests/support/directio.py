"""Whether the WAL's O_DIRECT write paths can run in a directory (tests choose or check a path with it)."""

from __future__ import annotations

import os
from pathlib import Path

from wal.aio import Aio
from wal.uring import Uring


def direct_io_works(directory: Path) -> bool:
    """Whether files in ``directory`` open with O_DIRECT (tmpfs, for one, refuses it)."""
    directory.mkdir(parents=True, exist_ok=True)
    probe = directory / "direct-probe"
    probe.write_bytes(b"")
    try:
        os.close(os.open(probe, os.O_RDONLY | os.O_DIRECT))
    except OSError:
        return False
    finally:
        probe.unlink()
    return True


def loop_writes_work(directory: Path, mode: str) -> bool:
    """Whether a WAL in ``directory`` with ``WalConfig.aio = mode`` ("auto": Linux AIO, "uring":
    io_uring, "adaptive": Linux AIO beside the I/O threads) writes its groups from the event loop rather than falling back to its I/O threads."""
    kernel = Aio.create(1) if mode in ("auto", "adaptive") else Uring.create(1)
    if kernel is None:
        return False
    kernel.close()
    return direct_io_works(directory)
