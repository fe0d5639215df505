"""The one read-only access to a SQLite metadata database: queries only, nothing written, no lock held.

Used by the remote reader (:mod:`s3stream.remote`), the CLI's read commands and
:func:`s3stream.binding.read_recorded_storage`. Invariants:

* The database file is never written: no migration, no integrity check that could repair, no
  journal-mode switch, no checkpoint. Every write operation of the store raises
  :class:`~s3stream.errors.InvalidArgumentError`.
* No file is created. A database another process has open (its ``-wal`` file exists) is opened
  ``mode=ro`` beside it and shares the writer's ``-shm`` index: every query sees every commit made
  before it. A database no process has open is opened ``immutable=1`` (SQLite then creates no
  ``-wal``/``-shm``); before each query the store checks whether that still holds (no ``-wal``
  file, same size and modification time of the database file) and reconnects when it does not, so a
  writer that opens the database later is followed from the next query on. A writer that starts and
  checkpoints within one query of an immutable connection can make that one query fail with
  :class:`~s3stream.errors.CorruptionError`; such a query is retried once on a new connection.
* Each query runs in its own read transaction: a consistent snapshot while writers commit.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import urllib.parse
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from s3stream.clock import wall_clock_ms
from s3stream.errors import ClosedError, ConflictError, CorruptionError, InvalidArgumentError, NotFoundError
from s3stream.metadata import controller as ctl
from s3stream.metadata import sql_view
from s3stream.metadata import sqlite_schema as schema
from s3stream.metadata.sqlite import BUSY_TIMEOUT_MS_DEFAULT, translate
from s3stream.metadata.store import TransactionalStore

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class _FileState:
    """What says whether an immutable connection may still be used."""

    wal_exists: bool
    size_bytes: int
    mtime_ns: int


def _file_state(path: str) -> _FileState:
    st = os.stat(path)
    return _FileState(os.path.exists(path + "-wal"), st.st_size, st.st_mtime_ns)


def connect_read_only(path: str) -> tuple[sqlite3.Connection, _FileState]:
    """A read-only connection to the database at ``path`` (blocking) and the file state it was opened
    in: ``mode=ro`` when another process has it open, ``immutable=1`` otherwise. Creates nothing."""
    state = _file_state(path)
    mode = "mode=ro" if state.wal_exists else "mode=ro&immutable=1"
    uri = f"file:{urllib.parse.quote(os.path.abspath(path))}?{mode}"
    conn = sqlite3.connect(
        uri,
        uri=True,
        isolation_level=None,
        check_same_thread=False,
        timeout=BUSY_TIMEOUT_MS_DEFAULT / 1000,
    )
    return conn, state


def read_kv_value(path: str | os.PathLike[str], key: str) -> bytes | None:
    """The KV value of ``key`` in the metadata database at ``path``, read without writing anything;
    None when the file, its KV table (created, never migrated) or the key does not exist. Blocking
    (call it in a thread from async code)."""
    path_text = os.fspath(path)
    if not os.path.isfile(path_text):
        return None
    try:
        conn, _ = connect_read_only(path_text)
        try:
            tables = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'kv'"
            ).fetchall()
            if not tables:
                return None
            return sql_view.SqlView(conn).kv(key)
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise translate(exc, path=path_text, busy_timeout_ms=BUSY_TIMEOUT_MS_DEFAULT) from exc


class ReadOnlySqliteStore(TransactionalStore):
    """A MetadataStore over a SQLite database opened read-only (see the module docstring). Open with
    :meth:`open`; ``close()`` when done. Queries run one at a time on one worker thread."""

    def __init__(self, conn: sqlite3.Connection, state: _FileState, path: str) -> None:
        super().__init__(wall_clock_ms)
        self._conn = conn
        self._state = state
        self._path = path
        # Every use of the connection, its close included, runs on this one thread, in call order: a
        # query whose caller was cancelled still runs to its end before the close (a connection
        # closed under a running query crashes the process).
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="s3stream-readonly-sqlite")
        self._closed = False

    @property
    def path(self) -> str:
        return self._path

    @classmethod
    async def open(cls, path: str | os.PathLike[str]) -> ReadOnlySqliteStore:
        """NotFoundError when there is no file at ``path``; InvalidArgumentError for a database that is
        not an s3stream metadata database; ConflictError for a schema version other than this code's."""
        path_text = os.fspath(path)
        if not await asyncio.to_thread(os.path.isfile, path_text):
            raise NotFoundError(f"no metadata database at {path_text}")

        def connect() -> tuple[sqlite3.Connection, _FileState]:
            conn, state = connect_read_only(path_text)
            try:
                version = schema.schema_version(conn)
                if version is None:
                    raise InvalidArgumentError(f"{path_text} is not an s3stream metadata database")
                if version != schema.LATEST_VERSION:
                    raise ConflictError(
                        f"{path_text} has metadata schema version {version}, this code reads "
                        f"{schema.LATEST_VERSION}: open it with a writer of the same version first"
                    )
            except BaseException:
                conn.close()
                raise
            return conn, state

        try:
            conn, state = await asyncio.to_thread(connect)
        except sqlite3.Error as exc:
            raise translate(exc, path=path_text, busy_timeout_ms=BUSY_TIMEOUT_MS_DEFAULT) from exc
        return cls(conn, state, path_text)

    async def _transact(self, fn: Callable[[ctl.Txn], T]) -> T:
        raise InvalidArgumentError(f"the metadata store {self._path} is open read-only")

    async def _query(self, fn: Callable[[ctl.StateView], T]) -> T:
        if self._closed:
            raise ClosedError(f"the metadata store {self._path} is closed")
        try:
            return await asyncio.get_running_loop().run_in_executor(self._thread, self._run_query, fn)
        except sqlite3.Error as exc:
            raise translate(exc, path=self._path, busy_timeout_ms=BUSY_TIMEOUT_MS_DEFAULT) from exc

    def _run_query(self, fn: Callable[[ctl.StateView], T]) -> T:
        """On the worker thread: one read transaction, on a connection that still fits the file."""
        immutable = not self._state.wal_exists
        if immutable and _file_state(self._path) != self._state:
            self._reconnect()
            immutable = not self._state.wal_exists
        try:
            return self._read(fn)
        except (sqlite3.DatabaseError, CorruptionError):
            if not immutable or _file_state(self._path) == self._state:
                raise
            self._reconnect()  # a writer changed the file under an immutable connection
            return self._read(fn)

    def _read(self, fn: Callable[[ctl.StateView], T]) -> T:
        self._conn.execute("BEGIN")
        try:
            return fn(sql_view.SqlView(self._conn))
        finally:
            self._conn.execute("ROLLBACK")

    def _reconnect(self) -> None:
        old = self._conn
        self._conn, self._state = connect_read_only(self._path)
        old.close()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await asyncio.get_running_loop().run_in_executor(self._thread, self._conn.close)
        finally:
            self._thread.shutdown(wait=False)
