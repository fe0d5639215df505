"""The durable MetadataStore: one SQLite file, one connection, one dedicated thread.

Durability: WAL journal mode, ``synchronous=FULL`` (a commit is on disk when the call returns),
foreign keys on, versioned schema migrations (:mod:`s3stream.metadata.sqlite_schema`).

Transactions: every operation runs the shared controller inside ``BEGIN IMMEDIATE`` and writes
all of its changes or none. Operations that queue up while the thread is busy are group-committed:
one ``BEGIN IMMEDIATE ... COMMIT`` (one fsync) holds them, each inside its own SAVEPOINT, so an
operation that fails rolls back alone while the others commit; no caller hears back before the
COMMIT is durable. Read-only operations use a deferred transaction.

Errors: a damaged or foreign file -> CorruptionError; locked or busy beyond ``busy_timeout_ms``,
or an I/O failure -> UnavailableError (retriable); a schema newer than this code -> ConflictError.
A caller cancelled while its operation is queued does not stop it: it may still commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import queue
import sqlite3
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from s3stream.clock import Clock, wall_clock_ms
from s3stream.errors import (
    ClosedError,
    ConflictError,
    CorruptionError,
    ErrorCode,
    InvalidArgumentError,
    S3StreamError,
    UnavailableError,
)
from s3stream.metadata import controller as ctl
from s3stream.metadata import sql_apply, sql_view, sqlite_copy
from s3stream.metadata import sqlite_schema as schema
from s3stream.metadata.store import TransactionalStore

T = TypeVar("T")

BATCH_OPERATIONS_MAX = 256
"""Operations one group commit may hold."""
QUEUED_OPERATIONS_MAX = 4 * BATCH_OPERATIONS_MAX
"""Operations waiting for the SQLite thread at most; further callers wait for a slot first."""
BUSY_TIMEOUT_MS_DEFAULT = 5_000

_SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_CORRUPT, _SQLITE_NOTADB = 5, 6, 11, 26
_UNDECODABLE_TEXT = "Could not decode to UTF-8"


def translate(exc: sqlite3.Error, *, path: str, busy_timeout_ms: int) -> S3StreamError:
    """The s3stream error for a sqlite3 error (callers raise it ``from exc``)."""
    primary = (getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF
    if primary in (_SQLITE_CORRUPT, _SQLITE_NOTADB):
        return CorruptionError(f"the metadata database is damaged or not a database: {exc}", source=path)
    if str(exc).startswith(_UNDECODABLE_TEXT):  # the sqlite3 module's error for a TEXT value not UTF-8
        return CorruptionError(f"the metadata database holds text that is not UTF-8: {exc}", source=path)
    if primary in (_SQLITE_BUSY, _SQLITE_LOCKED):
        return UnavailableError(f"the metadata database stayed locked beyond {busy_timeout_ms} ms: {exc}")
    if isinstance(exc, sqlite3.IntegrityError):
        return ConflictError(
            f"metadata integrity constraint failed: {exc}", code=ErrorCode.STREAM_INNER_ERROR
        )
    if isinstance(exc, sqlite3.OperationalError):
        return UnavailableError(f"the metadata database failed: {exc}")
    return CorruptionError(f"the metadata database failed: {exc}", source=path)


def damaged_text(exc: UnicodeDecodeError, path: str) -> CorruptionError:
    """A TEXT value (or schema text) that is not UTF-8: SQLite never stores one from our writes."""
    return CorruptionError(f"the metadata database holds text that is not UTF-8 ({exc.reason})", source=path)


@dataclass(slots=True)
class _Job(Generic[T]):
    fn: Callable[[sqlite3.Connection], T]
    write: bool
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[T]


def settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    """Complete a caller's future from its event loop (worker-thread stores: SQLite, PostgreSQL);
    a caller that gave up (cancelled) hears nothing."""
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class _Worker:
    """The thread owning the connection; runs queued jobs in group-committed transactions."""

    def __init__(
        self,
        path: str,
        busy_timeout_ms: int,
        setup: Callable[[sqlite3.Connection], None],
        ready: asyncio.Future[None],
        journal: sqlite_copy.CopyJournal,
    ) -> None:
        self._path = path
        self.journal = journal
        """Writes each write group's changes to ``pending_copy`` before its COMMIT."""
        self._busy_timeout_ms = busy_timeout_ms
        self._jobs: queue.SimpleQueue[_Job[Any] | None] = queue.SimpleQueue()
        """Bounded by ``_slots`` (one slot per queued or running job; a cancelled caller frees its
        slot early, so the bound is loose by the cancelled jobs still queued)."""
        self._slots = asyncio.Semaphore(QUEUED_OPERATIONS_MAX)
        self._conn: sqlite3.Connection | None = None
        self._dead = False
        self._dead_lock = threading.Lock()
        """Makes "not dead, so queue the job" atomic against the thread's "dead, so drain the queue"."""
        self._setup = setup
        self._ready = ready
        self._ready_loop = ready.get_loop()
        self._thread = threading.Thread(target=self._run, name=f"s3stream-metadata:{path}", daemon=True)
        self._thread.start()

    async def call(self, fn: Callable[[sqlite3.Connection], T], *, write: bool) -> T:
        """Run ``fn`` on the SQLite thread, waiting first for one of ``QUEUED_OPERATIONS_MAX`` slots."""
        async with self._slots:
            loop = asyncio.get_running_loop()
            future: asyncio.Future[T] = loop.create_future()
            with self._dead_lock:
                if self._dead:
                    raise ClosedError(f"the metadata store {self._path} is closed")
                self._jobs.put(_Job(fn, write, loop, future))
            return await future

    def stop(self) -> None:
        self._jobs.put(None)

    def join(self) -> None:
        self._thread.join()

    def _run(self) -> None:
        error = self._open()
        self._ready_loop.call_soon_threadsafe(settle, self._ready, None, error)
        if error is not None:
            self._dead = True
            return
        try:
            self._serve()
        finally:  # stopped, or died of a bug: nobody may wait forever on a job
            with self._dead_lock:
                self._dead = True
            if self._conn is not None:
                with contextlib.suppress(sqlite3.Error):
                    self._conn.close()
            while True:
                try:
                    job = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if job is not None:
                    error = ClosedError(f"the metadata store {self._path} is closed")
                    with contextlib.suppress(RuntimeError):
                        job.loop.call_soon_threadsafe(settle, job.future, None, error)

    def _serve(self) -> None:
        stopping = False
        while not stopping:
            first = self._jobs.get()
            if first is None:
                break
            batch = [first]
            while len(batch) < BATCH_OPERATIONS_MAX:
                try:
                    job = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if job is None:
                    stopping = True
                    break
                batch.append(job)
            self._run_batch(batch)

    def _open(self) -> BaseException | None:
        """Connect and run the setup (settings, integrity check, migrations) before any job."""
        try:
            if not os.path.isdir(os.path.dirname(os.path.abspath(self._path))):
                raise InvalidArgumentError(
                    f"the directory of the metadata store {self._path!r} does not exist"
                )
            self._conn = sqlite3.connect(
                self._path, timeout=self._busy_timeout_ms / 1000, isolation_level=None, check_same_thread=True
            )
            self._setup(self._conn)
        except sqlite3.Error as exc:
            error = translate(exc, path=self._path, busy_timeout_ms=self._busy_timeout_ms)
            error.__cause__ = exc
            return self._close_after(error)
        except UnicodeDecodeError as exc:
            error = damaged_text(exc, self._path)
            error.__cause__ = exc
            return self._close_after(error)
        except Exception as exc:  # noqa: BLE001 - thread boundary: handed to the opener
            return self._close_after(exc)
        return None

    def _close_after(self, error: BaseException) -> BaseException:
        if self._conn is not None:
            with contextlib.suppress(sqlite3.Error):
                self._conn.close()
            self._conn = None
        return error

    def _run_batch(self, batch: list[_Job[Any]]) -> None:
        outcomes: list[tuple[Any, BaseException | None]] = []
        conn = self._conn
        assert conn is not None
        try:
            if conn.in_transaction:  # an earlier failure left it open
                conn.execute("ROLLBACK")
            write = any(job.write for job in batch)
            conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            self.journal.begin()
            for job in batch:
                outcomes.append(self._run_job(conn, job, savepoint=write))
            if write:
                self.journal.before_commit(conn)
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            error = translate(exc, path=self._path, busy_timeout_ms=self._busy_timeout_ms)
            error.__cause__ = exc
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            outcomes = [(None, error)] * len(batch)
        except Exception as exc:  # noqa: BLE001 - thread boundary: a bug escaped a job; fail the batch
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            outcomes = [(None, exc)] * len(batch)
        for job, (result, failure) in zip(batch, outcomes, strict=True):
            with contextlib.suppress(RuntimeError):  # the caller's loop is closed: nobody is listening
                job.loop.call_soon_threadsafe(settle, job.future, result, failure)

    def _run_job(
        self, conn: sqlite3.Connection, job: _Job[Any], *, savepoint: bool
    ) -> tuple[Any, BaseException | None]:
        """Run one job; a domain error (or a bad argument) rolls back to its savepoint only."""
        if savepoint:
            conn.execute("SAVEPOINT op")
        try:
            result = job.fn(conn)
        except (S3StreamError, ValueError, TypeError) as exc:
            if savepoint:
                conn.execute("ROLLBACK TO op")
                conn.execute("RELEASE op")
            if isinstance(exc, UnicodeDecodeError):
                error = damaged_text(exc, self._path)
                error.__cause__ = exc
                return None, error
            return None, exc
        if savepoint:
            conn.execute("RELEASE op")
        return result, None


class SqliteMetadataStore(TransactionalStore):
    """A MetadataStore in one SQLite file. Open with :meth:`open`; ``close()`` when done."""

    def __init__(self, worker: _Worker, path: str, clock_ms: Clock, busy_timeout_ms: int) -> None:
        super().__init__(clock_ms)
        self._worker = worker
        self._path = path
        self._busy_timeout_ms = busy_timeout_ms
        self._closed = False
        self._copy_wait: Callable[[int], Awaitable[None]] | None = None

    @classmethod
    async def open(
        cls,
        path: str | os.PathLike[str],
        *,
        clock_ms: Clock = wall_clock_ms,
        busy_timeout_ms: int = BUSY_TIMEOUT_MS_DEFAULT,
        check_integrity: bool = True,
    ) -> SqliteMetadataStore:
        """Open (creating if needed) and migrate the database at ``path``.

        ``check_integrity`` runs SQLite's ``quick_check`` first (linear in the file size).
        """
        path_text = os.fspath(path)
        if not path_text or path_text == ":memory:" or path_text.startswith("file:"):
            raise InvalidArgumentError(f"the metadata store needs a file path, got {path_text!r}")
        if not isinstance(busy_timeout_ms, int) or busy_timeout_ms < 0:
            raise InvalidArgumentError(f"busy_timeout_ms must be a non-negative int, got {busy_timeout_ms!r}")
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        worker = _Worker(
            path_text,
            busy_timeout_ms,
            lambda conn: _initialize(conn, path_text, check_integrity),
            ready,
            sqlite_copy.CopyJournal(),
        )
        try:
            await ready
        except BaseException:
            worker.stop()
            await asyncio.to_thread(worker.join)
            raise
        return cls(worker, path_text, clock_ms, busy_timeout_ms)

    @property
    def path(self) -> str:
        return self._path

    async def _transact(self, fn: Callable[[ctl.Txn], T]) -> T:
        journal = self._worker.journal

        def run(conn: sqlite3.Connection) -> tuple[T, sqlite_copy.GroupSeq | None]:
            txn = ctl.Txn(sql_view.SqlView(conn))
            result = fn(txn)
            sql_apply.apply(conn, txn.changes)
            copied = sqlite_copy.copied_changes(txn.changes)
            if txn.changes and not copied:
                return result, None  # only session changes (a heartbeat): nothing to wait for
            return result, journal.add(copied)

        self._check_open()
        result, group = await self._worker.call(run, write=True)
        if self._copy_wait is not None and group is not None and group.seq > 0:
            # Everything this operation saw committed, its own changes included, is in the bucket's
            # copy before it returns (groups are copied in order).
            await self._copy_wait(group.seq)
        return result

    # -- the metadata copy (s3stream.metacopy) ------------------------------------------------
    def attach_copy(self, wait: Callable[[int], Awaitable[None]] | None) -> None:
        """Make every later write operation wait, before it returns, for ``wait(seq)``: the copy of
        the group commit ``seq`` (and every one before it) is in the bucket (None: stop waiting)."""
        self._copy_wait = wait

    async def copy_enable(self) -> sqlite_copy.CopyState:
        """Turn the change log on for this database (for good) and return the copy's state."""
        self._check_open()
        return await self._worker.call(sqlite_copy.enable, write=True)

    async def copy_state(self) -> sqlite_copy.CopyState | None:
        self._check_open()
        return await self._worker.call(sqlite_copy.state, write=False)

    async def copy_pending(self, *, bytes_max: int) -> list[tuple[int, bytes]]:
        """The oldest groups not yet copied (seq, encoded changes), about ``bytes_max`` of them."""
        self._check_open()
        return await self._worker.call(
            functools.partial(sqlite_copy.pending, bytes_max=bytes_max), write=False
        )

    async def copy_done(self, *, through_seq: int | None = None, snapshot_seq: int | None = None) -> None:
        """The groups up to ``through_seq`` are in a log object in the bucket; a snapshot covering
        ``snapshot_seq`` is."""
        self._check_open()
        await self._worker.call(
            functools.partial(sqlite_copy.drop_pending, through_seq=through_seq, snapshot_seq=snapshot_seq),
            write=True,
        )

    def snapshot_into(self, target: str) -> int:
        """Write a consistent copy of the database to ``target``; returns the last group it holds.
        Blocking (its own connection: run it in a thread); commits go on meanwhile."""
        self._check_open()
        try:
            return sqlite_copy.snapshot_into(self._path, target, busy_timeout_ms=self._busy_timeout_ms)
        except sqlite3.Error as exc:  # busy, disk full, I/O: the copier retries
            raise translate(exc, path=self._path, busy_timeout_ms=self._busy_timeout_ms) from exc
        except OSError as exc:
            raise UnavailableError(f"the metadata snapshot into {target} failed: {exc}") from exc

    async def _query(self, fn: Callable[[ctl.StateView], T]) -> T:
        self._check_open()
        return await self._worker.call(lambda conn: fn(sql_view.SqlView(conn)), write=False)

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"the metadata store {self._path} is closed")

    async def schema_version(self) -> int:
        version = await self._worker.call(schema.schema_version, write=False)
        assert version is not None
        return version

    async def close(self) -> None:
        """Finish the queued operations, then close the connection and stop the thread."""
        if self._closed:
            return
        self._closed = True
        self._worker.stop()
        await asyncio.to_thread(self._worker.join)


def _initialize(conn: sqlite3.Connection, path: str, check_integrity: bool) -> None:
    """Runs on the SQLite thread before any operation: settings, integrity, migrations, schema shape."""
    if check_integrity:
        # As bytes: quick_check quotes damaged text, which need not be UTF-8.
        conn.text_factory = bytes
        try:
            rows = conn.execute("PRAGMA quick_check").fetchall()
        finally:
            conn.text_factory = str
        if rows != [(b"ok",)]:
            detail = "; ".join(bytes(r[0]).decode(errors="replace") for r in rows[:5])
            raise CorruptionError(f"the metadata database failed quick_check: {detail}", source=path)
    mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()
    if mode is None or str(mode[0]).lower() != "wal":
        raise UnavailableError(f"could not switch {path} to WAL journal mode (got {mode!r})")
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("PRAGMA foreign_keys = ON")
    schema.migrate(conn)
    check_schema_shape(conn, path)


@functools.cache
def _expected_shape() -> dict[str, tuple[tuple[object, ...], ...]]:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    try:
        schema.migrate(conn)
        return _schema_shape(conn)
    finally:
        conn.close()


def _schema_shape(conn: sqlite3.Connection) -> dict[str, tuple[tuple[object, ...], ...]]:
    """Each table and index by name: its columns (name, declared type, not null, primary key part)."""
    shape: dict[str, tuple[tuple[object, ...], ...]] = {}
    names = conn.execute("SELECT type, name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'").fetchall()
    for kind, name in names:
        if kind == "table":
            rows = conn.execute('SELECT name, type, "notnull", pk FROM pragma_table_info(?)', (name,))
        else:
            rows = conn.execute("SELECT name FROM pragma_index_info(?)", (name,))
        shape[f"{kind} {name}"] = tuple(tuple(row) for row in rows.fetchall())
    return shape


def check_schema_shape(conn: sqlite3.Connection, path: str) -> None:
    """CorruptionError unless the tables and indexes are those the migrations build.

    ``quick_check`` does not read the schema's own text: a damaged column name there opens fine and
    fails every later statement that names it ("no such column", which is not a transient failure).
    """
    found = _schema_shape(conn)
    expected = _expected_shape()
    if found != expected:
        differing = sorted(set(found.items()) ^ set(expected.items()))
        names = sorted({name for name, _ in differing})
        raise CorruptionError(
            f"the metadata schema is not the one its version {schema.LATEST_VERSION} defines (differs in: "
            f"{', '.join(names[:5])}): the database is damaged",
            source=path,
        )
