"""WAL configuration in AutoMQ's naming style (``s3.wal.*``), validated with limits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from wal.errors import InvalidWalConfig

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

BLOCK_SIZES = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
CAPACITY_MIN_BYTES = 64 * KiB
CAPACITY_MAX_BYTES = 1 << 50
RECORD_MAX_LIMIT_BYTES = 1 << 30
IO_THREADS_MAX = 64


def align_up(value: int, block: int) -> int:
    return -(-value // block) * block


@dataclass(frozen=True)
class WalConfig:
    """Every limit of the WAL. Sizes in bytes. AutoMQ key in brackets.

    ``capacity_bytes`` [s3.wal.capacity] is rounded down to ``block_size_bytes``; it includes the two
    header slots. ``batch_max_bytes`` is the soft size of one group write (a larger single record still
    gets its own write). ``inflight_max_bytes`` bounds bytes accepted but not yet durable: appends wait
    beyond it (a single larger append or batch is admitted once nothing else is in flight).
    ``io_threads`` [s3.wal.thread] is how many write groups may be in flight at once (see
    :attr:`groups_inflight_max`); completions are still in offset order. ``aio="auto"`` writes
    groups to an O_DIRECT file or block device with Linux native AIO from the event loop (no I/O
    thread, no GIL hand-off: :mod:`wal.aio`) where the kernel offers it; ``aio="uring"`` writes them
    with io_uring, a write linked to an fdatasync (:mod:`wal.uring`), where the kernel offers it;
    ``aio="adaptive"`` writes them with Linux AIO while other processes leave the CPUs room (about
    one CPU free) and AIO is not measured slower than the I/O threads, and on the threads otherwise
    (:mod:`wal.adaptive`);
    ``"off"``, or a buffered or in-memory device, writes them on the I/O threads, as does any mode
    where its kernel interface is missing (``BlockWAL.mode`` tells). ``"adaptive"`` is the default:
    on a device without FUA (a write-back cache, e.g. this VM's virtio disk) an O_DSYNC AIO write
    completes through a kernel worker bound to one CPU that issues the cache flush, and while other
    processes keep the CPUs busy that worker waits to run (``"auto"``: 1 KiB appends at 0.06-0.8x
    the minimal loop with two CPU hogs on 2 cores), although AIO is faster on a machine with room
    (1.2-1.4x). The adaptive chooser takes AIO's speed where the CPUs have room and the threads
    where they do not: in the ``wal`` benchmark's alternating slices (two full runs each) 1.20-1.27 /
    1.25-1.27 / 1.22-1.37x the minimal group-commit loop with 1 / 16 / 256 producers and a p99 of
    0.98-1.65 ms at half the best rate on a quiet 2-core VM, and with two CPU hogs
    1.00-1.05 / 0.97-1.16 / 1.00-1.03x the I/O threads in the same slices (no group on AIO).
    ``"uring"`` does not collapse that way (no O_DSYNC write, the fdatasync runs on an io-wq thread
    of this process) but is not the default either: in the ``wal`` benchmark's alternating slices it
    ran 1 KiB appends with 1 / 16 / 256 producers at 1.02 / 0.93 / 1.24x the I/O threads on a quiet
    machine (AIO 1.27 / 1.22 / 1.40x) and 0.77 / 0.87 / 0.82x with two CPU-bound processes running
    (AIO 0.11 / 0.19 / 0.90x): its write's completion is posted by task work on the submitting (loop)
    thread, so each group waits twice for the loop thread to be scheduled.
    """

    capacity_bytes: int = 2 * GiB
    block_size_bytes: int = 4096
    record_max_bytes: int = 64 * MiB
    batch_max_bytes: int = 1 * MiB
    inflight_max_bytes: int = 128 * MiB
    io_threads: int = 2
    on_full: Literal["error", "wait"] = "error"
    direct_io: Literal["auto", "on", "off"] = "auto"
    aio: Literal["auto", "uring", "adaptive", "off"] = "adaptive"
    node_id: int = 0
    node_epoch: int = 0

    def __post_init__(self) -> None:
        def bad(msg: str) -> InvalidWalConfig:
            return InvalidWalConfig(f"s3.wal: {msg}")

        for name in (
            "capacity_bytes",
            "block_size_bytes",
            "record_max_bytes",
            "batch_max_bytes",
            "inflight_max_bytes",
            "io_threads",
            "node_id",
            "node_epoch",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise bad(f"{name} must be an int, got {value!r}")
        if self.block_size_bytes not in BLOCK_SIZES:
            raise bad(f"block_size_bytes {self.block_size_bytes} not one of {BLOCK_SIZES}")
        if not CAPACITY_MIN_BYTES <= self.capacity_bytes <= CAPACITY_MAX_BYTES:
            raise bad(
                f"capacity_bytes {self.capacity_bytes} not in [{CAPACITY_MIN_BYTES}, {CAPACITY_MAX_BYTES}]"
            )
        if not 1 <= self.record_max_bytes <= RECORD_MAX_LIMIT_BYTES:
            raise bad(f"record_max_bytes {self.record_max_bytes} not in [1, {RECORD_MAX_LIMIT_BYTES}]")
        if not self.block_size_bytes <= self.batch_max_bytes <= RECORD_MAX_LIMIT_BYTES:
            raise bad(
                f"batch_max_bytes {self.batch_max_bytes} not in [{self.block_size_bytes}, {RECORD_MAX_LIMIT_BYTES}]"
            )
        if not self.block_size_bytes <= self.inflight_max_bytes <= CAPACITY_MAX_BYTES:
            # (a record or batch above the bound is still admitted once nothing else is in flight)
            raise bad(
                f"inflight_max_bytes {self.inflight_max_bytes} not in [{self.block_size_bytes}, {CAPACITY_MAX_BYTES}]"
            )
        if self.write_max_bytes * 2 > self.record_area_bytes:
            raise bad(
                f"capacity_bytes {self.capacity_bytes} too small: the record area "
                f"({self.record_area_bytes}) must hold two of the largest writes ({self.write_max_bytes})"
            )
        if not 1 <= self.io_threads <= IO_THREADS_MAX:
            raise bad(f"io_threads {self.io_threads} not in [1, {IO_THREADS_MAX}]")
        if self.on_full not in ("error", "wait"):
            raise bad(f"on_full must be 'error' or 'wait', got {self.on_full!r}")
        if self.direct_io not in ("auto", "on", "off"):
            raise bad(f"direct_io must be 'auto', 'on' or 'off', got {self.direct_io!r}")
        if self.aio not in ("auto", "uring", "adaptive", "off"):
            raise bad(f"aio must be 'auto', 'uring', 'adaptive' or 'off', got {self.aio!r}")
        if not 0 <= self.node_id < 1 << 32:
            raise bad(f"node_id {self.node_id} not in [0, 2**32)")
        if not 0 <= self.node_epoch < 1 << 63:
            raise bad(f"node_epoch {self.node_epoch} not in [0, 2**63)")

    @property
    def device_bytes(self) -> int:
        """The capacity rounded down to the block size: the bytes of the device the WAL uses."""
        return self.capacity_bytes // self.block_size_bytes * self.block_size_bytes

    @property
    def record_area_bytes(self) -> int:
        return self.device_bytes - 2 * self.block_size_bytes

    @property
    def groups_inflight_max(self) -> int:
        """Write groups in flight at once, each on its own I/O thread: ``io_threads``, at most 4, and
        fewer when the recovery window would not fit four times in the record area."""
        room = self.record_area_bytes // (2 * self.write_max_bytes) - 1
        return max(1, min(self.io_threads, 4, room))

    @property
    def window_bytes(self) -> int:
        """How far past the end of the durable log a crash may have left written bytes.

        One group in flight: one write. K > 1 groups: K writes plus a padding record between them.
        """
        k = self.groups_inflight_max
        return self.write_max_bytes if k == 1 else (k + 1) * self.write_max_bytes

    @property
    def write_max_bytes(self) -> int:
        """The largest single group write: a batch, or one maximal record with its header, aligned."""
        from wal.format import RECORD_HEADER_SIZE

        return align_up(
            max(self.batch_max_bytes, self.record_max_bytes + RECORD_HEADER_SIZE), self.block_size_bytes
        )
