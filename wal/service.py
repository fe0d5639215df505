"""The block WAL service: :class:`BlockWAL`, its lifecycle (open, recover, close) and its properties.

``BlockWAL`` is the one public entry; it combines the parts, each in its own module:
:mod:`wal.intake` (append, admission and the queue), :mod:`wal.groups` (sealing, packing and in-order
completion of write groups), :mod:`wal.writer` (the write paths: I/O threads, Linux AIO, io_uring,
adaptive), :mod:`wal.headers` (header writes and trim), over the fields of :mod:`wal.state`. The
record and header bytes are :mod:`wal.format`'s; the recovery scan and its rule :mod:`wal.recovery`'s.

Open reads both header slots: zero slots make a new WAL (both header copies written at once), a
valid one an existing WAL that :meth:`BlockWAL.recover` scans, then bridges over what the last
session may have left torn (docs/format.md 4.5) before appends start. A WAL dropped without
``close()`` closes its device (descriptor and lock) once it is unreachable (``weakref.finalize``), as
``close()`` does.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import os
import random
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

from wal.config import WalConfig
from wal.device import Device, aligned_buffer, open_device
from wal.errors import InvalidWalConfig, WalClosedError, WalCorruptionError, WalFencedError
from wal.format import NO_CLEAN_END, Body, decode_wal_header, encode_padding
from wal.groups import GroupCommit
from wal.headers import HeaderWriter
from wal.intake import BodyParts, Intake
from wal.recovery import Scanner, WalRecord, align_up
from wal.writer import WritePaths

__all__ = ["BlockWAL", "Body", "BodyParts"]


class BlockWAL(Intake, GroupCommit, WritePaths, HeaderWriter):
    """A durable circular log of opaque records. Create with :meth:`open`, then run :meth:`recover`."""

    # ------------------------------------------------------------------ open / recover / close
    @classmethod
    async def open(cls, path: str | os.PathLike[str] | Device, config: WalConfig) -> BlockWAL:
        """Open (creating if needed) the WAL at ``path`` (file or block device) or on a Device object.

        A new WAL is ready for appends; an existing one needs :meth:`recover` first. Raises
        WalLockedError when another handle has it open, WalFencedError when its header has a newer node
        epoch, InvalidWalConfig when the device does not match ``config``.
        """
        loop = asyncio.get_running_loop()
        pool = ThreadPoolExecutor(max_workers=config.groups_inflight_max, thread_name_prefix="wal-io")
        try:
            if isinstance(path, (str, os.PathLike)):
                device = await loop.run_in_executor(pool, open_device, path, config)
            else:
                device = path
                if device.size_bytes < config.device_bytes:
                    raise InvalidWalConfig(
                        f"device of {device.size_bytes} bytes below capacity {config.device_bytes}"
                    )
        except BaseException:
            pool.shutdown(wait=False)
            raise
        self = cls(device, config, pool)
        try:
            await loop.run_in_executor(pool, self._load_header)
            if self._recovered:
                self._start_writer()
        except BaseException:
            await self._release()
            raise
        return self

    def _load_header(self) -> None:
        cfg = self._config
        block = cfg.block_size_bytes
        buf = aligned_buffer(2 * block)
        self._device.read_into(0, memoryview(buf)[: 2 * block])
        copies = [decode_wal_header(memoryview(buf)[k * block : k * block + block]) for k in (0, 1)]
        blank = buf[: 2 * block] == bytes(2 * block)
        buf.close()
        valid = [h for h in copies if h is not None]
        if not valid and not blank:
            raise WalCorruptionError(
                "neither header slot holds a valid WAL header and they are not zero: refusing to treat the "
                "device as new (zero its first 2 blocks to create a WAL there)",
                position=0,
            )
        if not valid:
            self._wal_id = random.getrandbits(32) | 1
            header = self._new_header(seq=0, trim_offset=0, start_offset=0, clean_end_offset=NO_CLEAN_END)
            # Both slots from the start: until the first trim or close writes the second copy, a
            # damaged single copy would make every record of the new WAL unreadable.
            self._write_header_sync(header)
            self._write_header_sync(header._replace(seq=1))
            self._seq = 1
            self._recovered = True
            return
        h = max(valid, key=lambda c: c.seq)
        if h.block_size != block or h.capacity != cfg.device_bytes:
            raise InvalidWalConfig(
                f"WAL was created with capacity {h.capacity} and block size {h.block_size}; configured "
                f"{cfg.device_bytes} and {block} (capacity cannot change after creation)"
            )
        if h.node_epoch > cfg.node_epoch:
            raise WalFencedError(
                f"WAL header has node epoch {h.node_epoch}, newer than ours ({cfg.node_epoch})"
            )
        self._header = h
        self._seq = h.seq
        self._wal_id = h.wal_id

    async def recover(self) -> AsyncIterator[WalRecord]:
        """Every durable, untrimmed record in offset order. Iterate to the end before appending.

        Raises WalCorruptionError (with the physical position) for damage the recovery rule does not
        explain. Yields nothing for a new WAL or when called again.
        """
        if self._closed or self._closing:
            raise WalClosedError("WAL is closed")
        if self._recovered or self._header is None:
            return
        scanner = Scanner(self._device, self._layout, self._header)
        while not scanner.done:
            batch = await self._loop.run_in_executor(self._pool, scanner.next_batch)
            for rec in batch:
                yield rec
        assert scanner.result is not None
        await self._loop.run_in_executor(self._pool, self._finish_recovery, scanner)
        self._start_writer()

    async def recover_all(self) -> list[WalRecord]:
        return [rec async for rec in self.recover()]

    def _finish_recovery(self, scanner: Scanner) -> None:
        h = self._header
        assert h is not None
        assert scanner.result is not None
        end = scanner.result.end_offset
        layout = self._layout
        tail = end
        starts = scanner.result.group_starts
        groups = [(s, e) for s, e in itertools.pairwise([*starts, end])]
        bridge = align_up(end, layout.block)
        if h.clean_end_offset == NO_CLEAN_END and bridge < h.start_offset + layout.area:
            # The last session may have left torn groups anywhere below end + window: bridge over them
            # with a padding record so that no byte it wrote is ever read as part of the log.
            new_start = min(bridge + h.window, h.start_offset + layout.area)
            pad = encode_padding(offset=bridge, length=new_start - bridge, wal_id=self._wal_id)
            self._write_padding_sync(bridge, pad)
            groups.append((bridge, new_start))
            tail = new_start
        self._groups = collections.deque(groups)
        self._tail = tail
        self._trim_offset = self._durable_trim = h.trim_offset
        self._flushed_start = self._requested_start = h.start_offset
        cfg = self._config
        header = h._replace(
            seq=self._seq + 1,
            node_id=cfg.node_id,
            inflight_groups=cfg.groups_inflight_max,
            node_epoch=cfg.node_epoch,
            window=cfg.window_bytes,
            clean_end_offset=NO_CLEAN_END,
        )
        self._write_header_sync(header)
        self._seq += 1
        self._recovered = True

    async def close(self) -> None:
        """Finish every queued append, write a clean-close header, release the device and its lock."""
        if self._closed:
            return
        self._closing = True
        self._accepting = False
        try:
            if self._started and self._failure is None:
                waiter = self._close_waiter = self._loop.create_future()
                self._schedule()
                await waiter
        finally:
            self._closed = True
            await self._release()

    async def _release(self) -> None:
        try:
            await self._stop_writer()
            await self._loop.run_in_executor(self._pool, self._close_device)  # (once: a finalizer)
        finally:
            self._pool.shutdown(wait=True)
            for view in self._wviews:
                view.release()
            with contextlib.suppress(BufferError):  # a failed write's traceback may still hold a view
                for buf in self._wbufs:
                    buf.close()
                self._pbuf.close()
                self._hbuf.close()

    # ------------------------------------------------------------------ properties
    @property
    def next_offset(self) -> int:
        """The end of the last appended record: every assigned offset is below it."""
        return self._tail

    @property
    def trim_offset(self) -> int:
        """Records with an offset below this are trimmed."""
        return self._trim_offset

    @property
    def capacity_bytes(self) -> int:
        return self._config.device_bytes
