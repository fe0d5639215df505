"""Block WAL: a durable, group-committed, circular log on a file or raw block device.

Imports nothing of s3stream. The on-disk format and the recovery rule are in docs/format.md,
section "4. Block WAL". In short: after a crash, a torn tail is the end of the log; records of the
last write groups (those that were in flight) may be missing, but corrupt data is never returned;
damage that the rule does not explain raises :class:`WalCorruptionError` with its position.
"""

from wal.config import WalConfig
from wal.device import BlockDevice, Device, FileDevice, MemoryDevice, open_device
from wal.errors import (
    InvalidWalConfig,
    WalArgumentError,
    WalCapacityError,
    WalClosedError,
    WalCorruptionError,
    WalError,
    WalFencedError,
    WalIOError,
    WalLockedError,
    WalStateError,
)
from wal.format import Body
from wal.intake import BodyParts
from wal.recovery import WalRecord
from wal.service import BlockWAL
from wal.sync import SyncBlockWAL

__all__ = [
    "BlockDevice",
    "BlockWAL",
    "Body",
    "BodyParts",
    "Device",
    "FileDevice",
    "InvalidWalConfig",
    "MemoryDevice",
    "SyncBlockWAL",
    "WalArgumentError",
    "WalCapacityError",
    "WalClosedError",
    "WalConfig",
    "WalCorruptionError",
    "WalError",
    "WalFencedError",
    "WalIOError",
    "WalLockedError",
    "WalRecord",
    "WalStateError",
    "open_device",
]
