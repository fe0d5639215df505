"""LocalObjectStorage: objects as files under one root directory (``file:///path``), the embedded default.

Layout: the object ``a/b/c`` is the file ``<root>/a/b/c``; directories appear as keys need them and
disappear when their last object is deleted. Keys are validated by :mod:`s3stream.storage.keys`, so
no key can name anything outside the root. A key cannot be both an object and the directory of
other objects (``a`` and ``a/b``): the second of the two writes raises ConflictError.

Atomic publish: data goes to a temporary file in the target directory (``.<name>~<random>``, ``~``
is never in a key, so listings skip it), is fsynced, then renamed over the key (``put``) or
hard-linked to it (``put(if_absent=True)``: ``link`` fails if the key exists, which makes the
conditional create exact under races, also between processes), and the directory is fsynced. A crash
leaves either the old state or the new object, plus at worst a stray temporary file
(:meth:`LocalObjectStorage.remove_stale_temp_files` reclaims those). The layout is also described in
``docs/format.md`` section 7.

All disk I/O runs on a dedicated thread pool, one hop per operation (open+write+fsync+rename+fsync
is one hop), so the event loop never blocks. Errors from the OS become NotFoundError (missing key),
ConflictError (key collision), InvalidArgumentError (range) or UnavailableError (any other OSError,
e.g. disk full or EIO; ``retriable`` is False for those since retrying rarely helps).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import stat
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from s3stream.errors import (
    ClosedError,
    ConflictError,
    InvalidArgumentError,
    NotFoundError,
    S3StreamError,
    UnavailableError,
)
from s3stream.storage.base import ObjectInfo, Upload, check_buffer_max_bytes
from s3stream.storage.keys import TEMP_MARKER, resolve_range, validate_key, validate_prefix, validate_range
from s3stream.storage.stats import StorageStats

T = TypeVar("T")

IO_THREADS_DEFAULT = 4
UPLOAD_BUFFER_MAX_BYTES = 8 * 1024 * 1024
"""An Upload hands its buffered writes to the disk thread once this many bytes are pending."""
UPLOAD_COPY_MAX_BYTES = 256 * 1024
"""A mutable buffer up to this size is copied on the event loop (a few us); a larger one is written
to the file from the disk thread before ``write`` returns, never copied (a 16 MiB copy stalls the
loop for 10-18 ms)."""
COPY_CHUNK_BYTES = 8 * 1024 * 1024
PUBLISH_RETRIES_MAX = 8
"""Attempts to create a key's directories when a concurrent delete keeps removing them."""


def _os_error(exc: OSError, what: str) -> S3StreamError:
    if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.EISDIR):
        return NotFoundError(f"{what}: not found")
    error = UnavailableError(f"{what}: {exc.strerror or exc}")
    error.retriable = exc.errno in (errno.EAGAIN, errno.EINTR, errno.EBUSY)
    return error


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    view = memoryview(data).cast("B")
    while view:
        written = os.write(fd, view)
        view = view[written:]


class LocalObjectStorage:
    """Objects as files under ``root``; see the module docstring for the layout and guarantees."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        io_threads: int = IO_THREADS_DEFAULT,
        list_page_size: int = 1000,
    ) -> None:
        if io_threads < 1 or list_page_size < 1:
            raise InvalidArgumentError("io_threads and list_page_size must be >= 1")
        self.root = Path(root).absolute()
        self.list_page_size = list_page_size
        self.stats = StorageStats()
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError) as exc:
            raise InvalidArgumentError(
                f"local object store root {self.root} is not a directory (it or a parent is a file)"
            ) from exc
        except ValueError as exc:  # an embedded NUL
            raise InvalidArgumentError(
                f"local object store root {str(self.root)!r} is not a valid path: {exc}"
            ) from exc
        except OSError as exc:
            raise _os_error(exc, f"local object store root {self.root}") from exc
        self._executor = ThreadPoolExecutor(max_workers=io_threads, thread_name_prefix="s3stream-local")
        self._closed = False

    def __repr__(self) -> str:
        return f"LocalObjectStorage({str(self.root)!r})"

    # -- plumbing ----------------------------------------------------------------------------

    async def _run(self, fn: Callable[..., T], *args: object) -> T:
        if self._closed:
            raise ClosedError(f"{self!r} is closed")
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*validate_key(key).split("/"))

    def _make_parents(self, key: str, path: Path) -> None:
        """Create the directories above ``path`` (fsyncing each new one's parent)."""
        current = self.root
        for part in path.relative_to(self.root).parts[:-1]:
            parent, current = current, current / part
            while True:
                try:
                    os.mkdir(current)
                except FileExistsError:
                    # One lstat, not two checks: a concurrent delete may prune the directory and a
                    # concurrent put make it again between any two looks at it.
                    try:
                        mode = os.lstat(current).st_mode
                    except FileNotFoundError:
                        continue  # pruned by a concurrent delete between mkdir and the check: make it again
                    if stat.S_ISDIR(mode):
                        break
                    raise ConflictError(
                        f"object {key!r} needs directory {part!r}, which is an object here"
                    ) from None
                _fsync_dir(parent)
                break

    def _prune_dirs(self, path: Path) -> set[Path]:
        """Remove now-empty directories above a deleted file; return directories to fsync."""
        touched = {path.parent}
        current = path.parent
        while current != self.root:
            try:
                os.rmdir(current)
            except OSError:
                break
            touched.discard(current)
            current = current.parent
            touched.add(current)
        return touched

    # -- blocking halves (run on the disk threads) -------------------------------------------

    def _new_temp(self, key: str, path: Path) -> tuple[int, Path]:
        for _ in range(PUBLISH_RETRIES_MAX):
            temp = path.with_name(f".{path.name}{TEMP_MARKER}{uuid.uuid4().hex}")
            try:
                self._make_parents(key, path)
                fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            except FileNotFoundError:
                continue  # a concurrent delete pruned a directory we just made (or were making)
            return fd, temp
        raise UnavailableError(f"object {key!r}: directory keeps disappearing under concurrent deletes")

    def _publish(self, key: str, path: Path, temp: Path, *, if_absent: bool) -> None:
        try:
            if if_absent:
                try:
                    os.link(temp, path)
                except FileExistsError:
                    raise ConflictError(f"object {key!r} already exists") from None
                finally:
                    os.unlink(temp)
            else:
                if path.is_dir():
                    raise ConflictError(f"object {key!r} is a directory of other objects here")
                os.replace(temp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)
            raise
        _fsync_dir(path.parent)

    def _put_sync(self, key: str, data: bytes | bytearray | memoryview, if_absent: bool) -> None:
        path = self._path(key)
        try:
            fd, temp = self._new_temp(key, path)
            try:
                _write_all(fd, data)
                os.fsync(fd)
            except BaseException:
                os.close(fd)
                os.unlink(temp)
                raise
            os.close(fd)
            self._publish(key, path, temp, if_absent=if_absent)
        except OSError as exc:
            raise _os_error(exc, f"put {key!r}") from exc

    def _read_sync(self, key: str, start: int, end: int | None) -> bytes:
        try:
            fd = os.open(self._path(key), os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise _os_error(exc, f"object {key!r}") from exc
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise NotFoundError(f"object {key!r}: not found")
            lo, hi = resolve_range(key, start, end, st.st_size)
            data = os.pread(fd, hi - lo, lo)
            if len(data) == hi - lo:
                return data
            out = bytearray(data)
            while len(out) < hi - lo:  # reads past 2 GiB come back short on Linux
                more = os.pread(fd, hi - lo - len(out), lo + len(out))
                if not more:
                    raise UnavailableError(f"object {key!r} shrank while being read")
                out += more
            return bytes(out)
        except OSError as exc:
            raise _os_error(exc, f"read {key!r}") from exc
        finally:
            os.close(fd)

    def _head_sync(self, key: str) -> ObjectInfo:
        try:
            st = os.stat(self._path(key))
        except OSError as exc:
            raise _os_error(exc, f"object {key!r}") from exc
        if not stat.S_ISREG(st.st_mode):
            raise NotFoundError(f"object {key!r}: not found")
        return ObjectInfo(key, st.st_size, st.st_mtime, f"{st.st_ino:x}-{st.st_mtime_ns:x}")

    def _delete_sync(self, keys: Sequence[str]) -> None:
        to_sync: set[Path] = set()
        for key in keys:
            path = self._path(key)
            try:
                os.unlink(path)
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                continue
            except OSError as exc:
                raise _os_error(exc, f"delete {key!r}") from exc
            to_sync |= self._prune_dirs(path)
        for directory in to_sync:
            with contextlib.suppress(FileNotFoundError):
                _fsync_dir(directory)

    def _list_sync(self, prefix: str) -> list[ObjectInfo]:
        head, _, _ = prefix.rpartition("/")
        start = self.root.joinpath(*head.split("/")) if head else self.root
        found: list[ObjectInfo] = []
        for dirpath, dirnames, filenames in os.walk(start):
            rel = os.path.relpath(dirpath, self.root)
            base = "" if rel == "." else rel.replace(os.sep, "/") + "/"
            if base and not (base.startswith(prefix) or prefix.startswith(base)):
                dirnames.clear()
                continue
            dirnames[:] = [
                d
                for d in dirnames
                if (base + d + "/").startswith(prefix) or prefix.startswith(base + d + "/")
            ]
            for name in filenames:
                key = base + name
                if TEMP_MARKER in name or not key.startswith(prefix):
                    continue
                try:
                    st = os.stat(os.path.join(dirpath, name))
                except FileNotFoundError:
                    continue
                found.append(ObjectInfo(key, st.st_size, st.st_mtime, f"{st.st_ino:x}-{st.st_mtime_ns:x}"))
        found.sort(key=lambda info: info.key)
        return found

    def _sweep_sync(self, older_than_s: float) -> int:
        cutoff = time.time() - older_than_s
        removed = 0
        for dirpath, _dirnames, filenames in os.walk(self.root):
            for name in filenames:
                if TEMP_MARKER not in name:
                    continue
                path = os.path.join(dirpath, name)
                with contextlib.suppress(FileNotFoundError):
                    if os.stat(path).st_mtime < cutoff:
                        os.unlink(path)
                        removed += 1
        return removed

    async def remove_stale_temp_files(self, older_than_s: float = 3600.0) -> int:
        """Delete temporary files a crashed writer left behind (untouched for ``older_than_s``).

        Temporary files never show in listings; this only reclaims their space. Returns how many
        were removed. Run it at startup, when no upload can be that old.
        """
        return await self._run(self._sweep_sync, older_than_s)

    # -- ObjectStorage -----------------------------------------------------------------------

    async def put(self, key: str, data: bytes | bytearray | memoryview, *, if_absent: bool = False) -> None:
        validate_key(key)
        await self._run(self._put_sync, key, data, if_absent)
        self.stats.record("put", memoryview(data).nbytes)

    def upload(self, key: str, *, buffer_max_bytes: int | None = None, if_absent: bool = False) -> Upload:
        """``buffer_max_bytes`` is validated and otherwise ignored: an upload never holds more than
        ``UPLOAD_BUFFER_MAX_BYTES`` pending plus the write in hand (larger writes go to the file).
        ``if_absent``: ``complete`` publishes only if the key does not exist (else ConflictError)."""
        validate_key(key)
        check_buffer_max_bytes(buffer_max_bytes)
        if self._closed:
            raise ClosedError(f"{self!r} is closed")
        return _LocalUpload(self, key, if_absent=if_absent)

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        validate_key(key)
        start, end = validate_range(key, start, end)
        if end is not None and start == end:
            return b""
        data = await self._run(self._read_sync, key, start, end)
        self.stats.record("get", len(data))
        return data

    async def head(self, key: str) -> ObjectInfo:
        validate_key(key)
        info = await self._run(self._head_sync, key)
        self.stats.record("head")
        return info

    async def delete(self, keys: Sequence[str]) -> None:
        for key in keys:
            validate_key(key)
        if keys:
            await self._run(self._delete_sync, list(keys))
        self.stats.record("delete")

    async def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        validate_prefix(prefix)
        found = await self._run(self._list_sync, prefix)
        self.stats.record("list")
        for info in found:
            yield info

    async def close(self) -> None:
        """Refuse new calls, then wait (off the event loop) for the disk work already running."""
        if not self._closed:
            self._closed = True
            await asyncio.to_thread(self._executor.shutdown, wait=True)


class _LocalUpload:
    """Streams into a temporary file next to the key; published by rename on :meth:`complete`."""

    def __init__(self, storage: LocalObjectStorage, key: str, *, if_absent: bool = False) -> None:
        self.key = key
        self._storage = storage
        self._if_absent = if_absent
        self._path = storage._path(key)
        self._fd = -1
        self._temp: Path | None = None
        self._pending: list[bytes | bytearray | memoryview] = []
        self._pending_bytes = 0
        self._size_bytes = 0
        self._done = False

    def _check_active(self) -> None:
        if self._done:
            raise ClosedError(f"upload of {self.key!r} already completed or aborted")

    def _flush_sync(self, chunks: list[bytes | bytearray | memoryview]) -> None:
        try:
            if self._fd < 0:
                self._fd, self._temp = self._storage._new_temp(self.key, self._path)
            for chunk in chunks:
                _write_all(self._fd, chunk)
        except OSError as exc:
            raise _os_error(exc, f"upload {self.key!r}") from exc

    def _copy_sync(
        self, chunks: list[bytes | bytearray | memoryview], source_key: str, start: int, end: int
    ) -> None:
        self._flush_sync(chunks)
        try:
            src = os.open(self._storage._path(source_key), os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise _os_error(exc, f"copy source {source_key!r}") from exc
        try:
            resolve_range(source_key, start, end, os.fstat(src).st_size)
            position = start
            while position < end:
                data = os.pread(src, min(COPY_CHUNK_BYTES, end - position), position)
                if not data:
                    raise UnavailableError(f"copy source {source_key!r} shrank while being read")
                _write_all(self._fd, data)
                position += len(data)
        except OSError as exc:
            raise _os_error(exc, f"copy {source_key!r} into {self.key!r}") from exc
        finally:
            os.close(src)

    def _complete_sync(self, chunks: list[bytes | bytearray | memoryview]) -> None:
        self._flush_sync(chunks)
        assert self._temp is not None
        try:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = -1
            self._storage._publish(self.key, self._path, self._temp, if_absent=self._if_absent)
        except OSError as exc:
            raise _os_error(exc, f"complete {self.key!r}") from exc

    def _discard_sync(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._temp is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._temp)

    def _take_pending(self) -> list[bytes | bytearray | memoryview]:
        chunks, self._pending, self._pending_bytes = self._pending, [], 0
        return chunks

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        """Append ``data``; the caller may reuse its buffer as soon as this returns.

        ``bytes`` are kept as they are until ``UPLOAD_BUFFER_MAX_BYTES`` is pending. Any other buffer
        may change or pin memory after we return: a small one is copied, a larger one is written to
        the temporary file (after what is pending) by the disk thread before we return, without a
        copy on the event loop. The file's bytes are described in ``docs/format.md`` section 7.
        """
        self._check_active()
        size = memoryview(data).nbytes
        if size == 0:
            return
        self._size_bytes += size
        if not isinstance(data, bytes) and size > UPLOAD_COPY_MAX_BYTES:
            chunks = self._take_pending()
            chunks.append(data)
            await self._guard(self._storage._run(self._flush_sync, chunks))
            return
        self._pending.append(data if isinstance(data, bytes) else bytes(data))
        self._pending_bytes += size
        if self._pending_bytes >= UPLOAD_BUFFER_MAX_BYTES:
            await self._guard(self._storage._run(self._flush_sync, self._take_pending()))

    async def copy(self, source_key: str, start: int, end: int) -> None:
        self._check_active()
        try:
            validate_key(source_key)
            validate_range(source_key, start, end)
        except InvalidArgumentError:
            await self.abort()
            raise
        await self._guard(self._storage._run(self._copy_sync, self._take_pending(), source_key, start, end))
        self._size_bytes += end - start
        self._storage.stats.record("copy", end - start)

    async def _guard(self, step: Coroutine[Any, Any, None]) -> None:
        """Await one disk step; a failure (or cancellation) aborts the whole upload.

        A cancelled caller does not stop the step on its disk thread: the abort waits for it to end,
        so it never closes the file under a running write nor misses a temporary file made late.
        """
        running = asyncio.ensure_future(step)
        try:
            await asyncio.shield(running)
        except BaseException:
            await asyncio.wait([running])
            if not running.cancelled():
                running.exception()  # seen: the caller gets its own error (or cancellation)
            await self.abort()
            raise

    async def complete(self) -> int:
        self._check_active()
        await self._guard(self._storage._run(self._complete_sync, self._take_pending()))
        self._done = True
        self._storage.stats.record("put", self._size_bytes)
        return self._size_bytes

    async def abort(self) -> None:
        if self._done:
            return
        self._done = True
        self._pending = []
        if self._fd >= 0 or self._temp is not None:
            try:
                await asyncio.get_running_loop().run_in_executor(self._storage._executor, self._discard_sync)
            except RuntimeError:  # the store was closed: its threads are gone
                self._discard_sync()
