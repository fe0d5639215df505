"""The block WAL behind the engine's WAL port: :class:`BlockWalAdapter` adapts :class:`wal.BlockWAL` to
:class:`~s3stream.engine.walport.WriteAheadLog`, and :func:`wal_error` is the one boundary where the
WAL's errors become s3stream's kinds (``wal`` imports nothing of ours)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from s3stream.engine.walport import BodyParts
from s3stream.errors import (
    CapacityError,
    ClosedError,
    ConflictError,
    CorruptionError,
    FencedError,
    InvalidArgumentError,
    S3StreamError,
    UnavailableError,
)
from wal import BlockWAL, WalConfig
from wal import errors as walerr


class BlockWalAdapter:
    """Adapts :class:`wal.BlockWAL` to the engine's :class:`~s3stream.engine.walport.WriteAheadLog`,
    translating the WAL's errors to s3stream's kinds (the WAL imports nothing of ours)."""

    def __init__(self, block_wal: BlockWAL, path: str) -> None:
        self._wal = block_wal
        self._path = path
        self.append_untranslated = block_wal.append
        """The block WAL's own append: the engine's hot path awaits it directly (one coroutine frame
        less per append) and translates its failures with :meth:`translate_error`."""

    @property
    def block_wal(self) -> BlockWAL:
        """The adapted WAL (its group-write counters are metrics)."""
        return self._wal

    def translate_error(self, exc: BaseException) -> BaseException:
        """The exception :meth:`append` raises instead of ``exc`` (a WAL or OS error's s3stream kind)."""
        if isinstance(exc, walerr.WalError | OSError):
            error = wal_error(exc, self._path)
            error.__cause__ = exc
            return error
        return exc

    async def append(self, body: BodyParts) -> int:
        # The hot path: a plain try costs less than the context manager the other calls use. Parts
        # go to the block WAL as they are: it writes them as one record with one body CRC.
        try:
            return await self._wal.append(body)
        except (walerr.WalError, OSError) as exc:
            raise wal_error(exc, self._path) from exc

    async def trim(self, offset: int) -> None:
        with translate_wal_errors(self._path):
            await self._wal.trim(offset)

    async def recover(self) -> list[tuple[int, bytes]]:
        with translate_wal_errors(self._path):
            return [(r.offset, r.data) for r in await self._wal.recover_all()]

    async def close(self) -> None:
        with translate_wal_errors(self._path):
            await self._wal.close()


@contextlib.contextmanager
def translate_wal_errors(path: str) -> Iterator[None]:
    """The one boundary where WAL errors become s3stream errors."""
    try:
        yield
    except (walerr.WalError, OSError) as exc:
        raise wal_error(exc, path) from exc


def wal_error(exc: walerr.WalError | OSError, path: str) -> S3StreamError:
    """The s3stream error kind of a WAL error."""
    if isinstance(exc, walerr.WalCapacityError):
        return CapacityError(f"WAL full: {exc}")
    if isinstance(exc, walerr.WalClosedError):
        return ClosedError(f"WAL closed: {exc}")
    if isinstance(exc, walerr.WalFencedError):
        return FencedError(f"WAL {path} fenced: {exc}")
    if isinstance(exc, walerr.WalLockedError):
        return ConflictError(f"data dir in use: WAL {path} is open in another process ({exc})")
    if isinstance(exc, walerr.WalArgumentError | walerr.InvalidWalConfig):
        return InvalidArgumentError(f"WAL {path}: {exc}")
    if isinstance(exc, walerr.WalCorruptionError):
        return CorruptionError(str(exc), source=path)
    return UnavailableError(f"WAL {path} failed: {exc}")


async def open_block_wal_file(path: str, config: WalConfig) -> BlockWalAdapter:
    """Open (creating and preallocating if needed) the block WAL file at ``path``."""
    with translate_wal_errors(path):
        block_wal = await BlockWAL.open(path, config)
    return BlockWalAdapter(block_wal, path)
