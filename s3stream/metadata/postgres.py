"""The shared MetadataStore: PostgreSQL over psycopg 3, a few worker threads each owning a connection.

Threads: the controller reads through a synchronous view, so each operation runs whole on one of
``connections`` worker threads, each owning one blocking psycopg connection (autocommit mode, the
transactions spelled out); the event loop only queues the operation and awaits its future. A
process's operations overlap up to ``connections`` at a time.

Transactions: a write is one ``SERIALIZABLE`` transaction: the controller decides from what it reads
and its changes are applied (the statements are SQLite's, :mod:`s3stream.metadata.postgres_schema`).
PostgreSQL aborts one of two transactions whose reads and writes could not have run one after the
other (SQLSTATE 40001) and one of a deadlock (40P01); the operation is then run again from the start
on a new snapshot, after a jittered backoff, at most ``RETRY_ATTEMPTS_MAX`` times and within
``RETRY_DEADLINE_MS`` (then UnavailableError, retriable). So every operation behaves as if the
operations of every process ran one at a time, in some order. A refusal (FencedError,
ConflictError, ...) is decided in the same transaction and reported only after it commits (having
written nothing), so it too rests on a state that existed. A read is one ``REPEATABLE READ READ ONLY``
transaction: one consistent snapshot. Operations a caller issues concurrently (without awaiting one
before the next) may commit in any order; an awaited one precedes every later one.

Connections: a connection found dead before an operation's transaction began is replaced once and
the operation runs on the new one (nothing of it reached the server); one that breaks during the
transaction fails the operation, and a write's server session is then waited out before any later
operation (:mod:`s3stream.metadata.postgres_unfinished`).

Errors: connection refused, server gone, a timeout -> UnavailableError naming the URL without its
password; failed authentication or a database that does not exist -> InvalidArgumentError; a table or
column missing or altered -> CorruptionError; a schema newer than this code -> ConflictError; a
closed store -> ClosedError. A caller cancelled while its operation runs does not stop it: it may
still commit. Clock: the server's (:mod:`s3stream.metadata.postgres_clock`) unless one is given.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import random
import re
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

import psycopg
from psycopg import conninfo

from s3stream.clock import Clock
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
from s3stream.metadata import postgres_schema as schema
from s3stream.metadata import sql_apply, sql_view
from s3stream.metadata.postgres_clock import ServerClock
from s3stream.metadata.postgres_unfinished import Session, UnfinishedSessions, session_of
from s3stream.metadata.sqlite import settle
from s3stream.metadata.store import TransactionalStore
from s3stream.metadata.url import MetadataURL, parse_metadata_url

T = TypeVar("T")

CONNECTIONS_DEFAULT = 4
CONNECTIONS_MAX = 64
QUEUED_OPERATIONS_MAX = 1024
"""Operations waiting for a worker at most; further callers wait for a slot first."""
RETRY_ATTEMPTS_MAX = 100
"""Runs of one operation at most when PostgreSQL aborts it for a conflict (40001, 40P01, 55P03)."""
RETRY_DEADLINE_MS = 30_000
"""No new run of an aborted operation starts later than this after its first."""
BACKOFF_MS_MIN = 1
BACKOFF_MS_MAX = 100
CONNECT_TIMEOUT_S = 10
STATEMENT_TIMEOUT_MS = 30_000
"""The server cancels a statement running longer (57014 -> UnavailableError)."""
LOCK_TIMEOUT_MS = 2_000
"""A statement waiting this long for a row lock gives up (55P03) and its transaction runs again: a
lock is held only inside one of these short transactions, so a long wait means its holder stopped."""
IDLE_IN_TRANSACTION_TIMEOUT_MS = 2_000
"""The server ends a session idle this long inside a transaction, rolling it back and releasing its
locks. A transaction here sends its statements back to back, so only a paused process (SIGSTOP, a
frozen VM) sits idle in one; without this its locks on shared rows (the leases every node renews)
would hold back every other node's writes, heartbeats included, until the leases of live nodes end."""
TCP_USER_TIMEOUT_MS = 30_000
"""A connection whose sent data stays unacknowledged this long is dropped (a silent server)."""

_CONNECT_DEFAULTS: dict[str, Any] = {
    "connect_timeout": CONNECT_TIMEOUT_S,
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": TCP_USER_TIMEOUT_MS,
    "application_name": "s3stream",
}
SESSION_SETUP = (
    f"SET statement_timeout = {STATEMENT_TIMEOUT_MS}; SET lock_timeout = {LOCK_TIMEOUT_MS}; "
    f"SET idle_in_transaction_session_timeout = {IDLE_IN_TRANSACTION_TIMEOUT_MS}"
)
_BEGIN: dict[str, str] = {
    "write": "BEGIN ISOLATION LEVEL SERIALIZABLE",
    "read": "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY",
}
_CONFLICT_SQLSTATES = frozenset({"40001", "40P01", "55P03"})
"""Serialization failure, deadlock, lock wait past ``LOCK_TIMEOUT_MS``: the transaction runs again."""
_AUTH_SQLSTATES = frozenset({"28000", "28P01"})
_AUTH_FAILED = re.compile(r'authentication failed|FATAL: +role ".*" does not exist')
_NO_DATABASE = re.compile(r'FATAL: +database ".*" does not exist')
_DOMAIN_ERRORS = (S3StreamError, ValueError, TypeError)
"""What a controller function raises to refuse an operation (nothing written)."""


def translate(exc: psycopg.Error, *, where: str, password: str | None) -> S3StreamError:
    """The s3stream error for a psycopg error (callers raise it ``from exc``); ``where`` is the
    URL without its password, and ``password`` is scrubbed from the server's message."""
    state = exc.sqlstate or ""
    text = " ".join(str(exc).split())  # libpq's messages span lines; an error is one line
    if password:
        text = text.replace(password, "***")
    # libpq reports a refused connection without a SQLSTATE: its message tells
    if state in _AUTH_SQLSTATES or _AUTH_FAILED.search(text):
        return InvalidArgumentError(f"the metadata database {where} refused the credentials: {text}")
    if state == "3D000" or _NO_DATABASE.search(text):
        return InvalidArgumentError(f"the metadata database {where} does not exist: {text}")
    if state.startswith("23"):
        return ConflictError(
            f"metadata integrity constraint failed: {text}", code=ErrorCode.STREAM_INNER_ERROR
        )
    if state.startswith("22") or (not state and isinstance(exc, psycopg.DataError)):
        return InvalidArgumentError(f"the metadata database {where} refused a value: {text}")
    if state.startswith("42") or state in ("XX001", "XX002"):
        return CorruptionError(f"the metadata schema is damaged or not s3stream's: {text}", source=where)
    return UnavailableError(f"the metadata database {where} is unavailable: {text}")


def connection_info(url: MetadataURL) -> tuple[str, str | None]:
    """libpq's connection string for ``url`` (with this store's timeouts and keepalives where the
    URL sets none) and the URL's password; InvalidArgumentError for a URL libpq refuses."""
    raw_password = urllib.parse.urlsplit(url.url).password
    try:
        params = conninfo.conninfo_to_dict(url.url)
    except psycopg.Error as exc:
        text = " ".join(str(exc).split())
        query = urllib.parse.parse_qsl(urllib.parse.urlsplit(url.url).query, keep_blank_values=True)
        secrets = [raw_password or ""] + [v for n, v in query if n.lower() == "password"]
        for secret in filter(None, secrets):
            for form in {secret, urllib.parse.quote(secret, safe=""), urllib.parse.unquote(secret)}:
                text = text.replace(form, "***")
        raise InvalidArgumentError(
            f"metadata URL {url.describe()} is not a valid libpq URL: {text}"
        ) from None
    password = params.get("password")
    for key, value in _CONNECT_DEFAULTS.items():
        params.setdefault(key, value)
    return conninfo.make_conninfo("", **params), None if password is None else str(password)


@dataclass(slots=True)
class _Job(Generic[T]):
    fn: Callable[[psycopg.Connection[Any]], T]
    mode: Literal["write", "read", "raw"]
    """``raw``: ``fn`` runs on the connection as it is (no transaction, no retry)."""
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[T]


def _rollback(conn: psycopg.Connection[Any]) -> None:
    with contextlib.suppress(psycopg.Error):
        if not conn.closed and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            conn.execute("ROLLBACK")


class _Pool:
    """``size`` worker threads sharing one queue of operations; each owns one connection, opened on
    its first operation and again after a failure broke it."""

    def __init__(self, url: MetadataURL, size: int, clock: ServerClock | None) -> None:
        self._where = url.describe()
        self._conninfo, self._password = connection_info(url)
        self._clock = clock
        self._jobs: queue.SimpleQueue[_Job[Any] | None] = queue.SimpleQueue()
        self._slots = asyncio.Semaphore(QUEUED_OPERATIONS_MAX)
        self.conflict_retries = 0
        """Runs of operations PostgreSQL aborted for a conflict and that ran again (a statistic)."""
        self._unfinished = UnfinishedSessions()
        self._stopped = False
        self._stop_lock = threading.Lock()
        """Makes "not stopped, so queue the job" atomic against ``stop``'s sentinels."""
        self._threads = [
            threading.Thread(target=self._serve, name=f"s3stream-metadata-pg-{i}", daemon=True)
            for i in range(size)
        ]
        for thread in self._threads:
            thread.start()

    @property
    def where(self) -> str:
        return self._where

    async def call(
        self, fn: Callable[[psycopg.Connection[Any]], T], mode: Literal["write", "read", "raw"]
    ) -> T:
        async with self._slots:
            loop = asyncio.get_running_loop()
            future: asyncio.Future[T] = loop.create_future()
            with self._stop_lock:
                if self._stopped:
                    raise ClosedError(f"the metadata store {self._where} is closed")
                self._jobs.put(_Job(fn, mode, loop, future))
            return await future

    def stop(self) -> None:
        """Let the queued operations finish, then end every thread (one sentinel each)."""
        with self._stop_lock:
            if self._stopped:
                return
            self._stopped = True
            for _ in self._threads:
                self._jobs.put(None)

    def join(self) -> None:
        for thread in self._threads:
            thread.join()

    def _serve(self) -> None:
        link = _Link()
        try:
            while (job := self._jobs.get()) is not None:
                error: BaseException | None
                try:
                    result, error = self._serve_one(link, job), None
                except psycopg.Error as exc:
                    failure = translate(exc, where=self._where, password=self._password)
                    failure.__cause__ = exc
                    result, error = None, failure
                except Exception as exc:  # noqa: BLE001 - thread boundary: handed to the caller
                    result, error = None, exc
                with contextlib.suppress(RuntimeError):  # the caller's loop is closed: nobody listens
                    job.loop.call_soon_threadsafe(settle, job.future, result, error)
        finally:
            link.close()

    def _serve_one(self, link: _Link, job: _Job[T]) -> T:
        """Run ``job`` on this thread's connection. A connection kept from earlier operations that
        turns out dead before the job's transaction began (the server restarted, or ended the idle
        session) is replaced once: nothing of the job reached the server."""
        reused = link.conn is not None and not (link.conn.closed or link.conn.broken)
        try:
            return self._run(self._ready(link, job), link, job)
        except _DeadBeforeBegin as dead:
            if not reused:
                raise dead.error from None
        try:
            return self._run(self._ready(link, job), link, job)
        except _DeadBeforeBegin as dead:
            raise dead.error from None

    def _ready(self, link: _Link, job: _Job[Any]) -> psycopg.Connection[Any]:
        """This thread's connection (opened if needed), once no cut write's session is left and the
        clock is sampled (``_initialize`` samples it for the raw job that opens the store)."""
        conn = link.conn
        if conn is None or conn.closed or conn.broken:
            conn = link.connect(self._conninfo)
        try:
            if self._unfinished:
                self._unfinished.wait_ended(conn)
            if self._clock is not None and job.mode != "raw" and self._clock.stale():
                self._clock.sample(conn)
        except psycopg.Error as exc:
            if conn.broken:
                raise _DeadBeforeBegin(exc) from exc
            raise
        return conn

    def _run(self, conn: psycopg.Connection[Any], link: _Link, job: _Job[T]) -> T:
        """Run ``job`` in its transaction, again from the start while PostgreSQL aborts it for a
        conflict (bounded); a refusal is raised once the transaction that decided it commits."""
        try:
            if job.mode == "raw":
                return job.fn(conn)
            return self._transaction(conn, job)
        except psycopg.Error:
            if job.mode == "write" and (conn.broken or conn.closed) and link.session is not None:
                self._unfinished.add(link.session)  # its COMMIT may still land: see the module
            _rollback(conn)
            raise
        except BaseException:
            _rollback(conn)
            raise

    def _transaction(self, conn: psycopg.Connection[Any], job: _Job[T]) -> T:
        begin = _BEGIN[job.mode]
        first_ms = time.monotonic() * 1000
        attempt = 0
        while True:
            attempt += 1
            try:
                try:
                    conn.execute(begin)
                except psycopg.Error as exc:
                    if attempt == 1 and conn.broken:
                        raise _DeadBeforeBegin(exc) from exc
                    raise
                try:
                    result = job.fn(conn)
                except _DOMAIN_ERRORS:
                    conn.execute("COMMIT")  # nothing was written; commits only if what it read holds
                    raise
                conn.execute("COMMIT")
                return result
            except psycopg.Error as exc:
                if exc.sqlstate not in _CONFLICT_SQLSTATES:
                    raise
                _rollback(conn)
                elapsed_ms = time.monotonic() * 1000 - first_ms
                if attempt >= RETRY_ATTEMPTS_MAX or elapsed_ms >= RETRY_DEADLINE_MS:
                    raise UnavailableError(
                        f"the metadata database {self._where} aborted the operation for conflicts "
                        f"{attempt} times in {elapsed_ms:.0f} ms: {exc}"
                    ) from exc
                with self._stop_lock:
                    self.conflict_retries += 1
                backoff_ms = min(BACKOFF_MS_MAX, BACKOFF_MS_MIN << min(attempt, 10))
                time.sleep(random.uniform(0, backoff_ms) / 1000)


class _DeadBeforeBegin(Exception):
    """The connection was found broken before the operation's transaction began."""

    def __init__(self, error: psycopg.Error) -> None:
        super().__init__(str(error))
        self.error = error


class _Link:
    """One worker thread's connection and its server session."""

    def __init__(self) -> None:
        self.conn: psycopg.Connection[Any] | None = None
        self.session: Session | None = None

    def connect(self, conninfo: str) -> psycopg.Connection[Any]:
        self.close()
        conn = psycopg.connect(conninfo, autocommit=True)
        try:
            conn.execute(SESSION_SETUP)
            self.session = session_of(conn)
        except BaseException:
            conn.close()
            raise
        self.conn = conn
        return conn

    def close(self) -> None:
        conn, self.conn, self.session = self.conn, None, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()


class PostgresMetadataStore(TransactionalStore):
    """A MetadataStore in one PostgreSQL schema. Open with :meth:`open`; ``close()`` when done."""

    def __init__(self, pool: _Pool, clock_ms: Clock) -> None:
        super().__init__(clock_ms)
        self._pool = pool
        self._closed = False

    @classmethod
    async def open(
        cls,
        url: str | MetadataURL,
        *,
        clock_ms: Clock | None = None,
        connections: int = CONNECTIONS_DEFAULT,
    ) -> PostgresMetadataStore:
        """Connect, then create or migrate the schema (the first schema on the URL's search_path).

        ``clock_ms`` None: the database server's clock. ``connections``: worker threads, each with
        its own connection (opened on first use).
        """
        parsed = url if isinstance(url, MetadataURL) else parse_metadata_url(url)
        if parsed.is_sqlite:
            raise InvalidArgumentError(f"{parsed.describe()} is not a PostgreSQL URL")
        if not isinstance(connections, int) or not 1 <= connections <= CONNECTIONS_MAX:
            raise InvalidArgumentError(
                f"connections must be an int in [1, {CONNECTIONS_MAX}], got {connections!r}"
            )
        server_clock = ServerClock() if clock_ms is None else None
        clock: Clock = server_clock if server_clock is not None else clock_ms  # type: ignore[assignment]
        pool = _Pool(parsed, connections, server_clock)
        try:
            await pool.call(lambda conn: _initialize(conn, server_clock), "raw")
        except BaseException:
            pool.stop()
            await asyncio.to_thread(pool.join)
            raise
        return cls(pool, clock)

    @property
    def where(self) -> str:
        """The URL without its password."""
        return self._pool.where

    @property
    def conflict_retries(self) -> int:
        """Operations PostgreSQL aborted for a conflict (40001, 40P01, 55P03) and that ran again, so far."""
        return self._pool.conflict_retries

    async def _transact(self, fn: Callable[[ctl.Txn], T]) -> T:
        def run(conn: psycopg.Connection[Any]) -> T:
            sql = schema.PgConnection(conn)
            txn = ctl.Txn(sql_view.SqlView(sql, schema.POSTGRES_DIALECT))
            result = fn(txn)
            sql_apply.apply(sql, txn.changes, schema.POSTGRES_DIALECT)
            return result

        self._check_open()
        return await self._pool.call(run, "write")

    async def _query(self, fn: Callable[[ctl.StateView], T]) -> T:
        self._check_open()
        return await self._pool.call(
            lambda conn: fn(sql_view.SqlView(schema.PgConnection(conn), schema.POSTGRES_DIALECT)), "read"
        )

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"the metadata store {self.where} is closed")

    async def schema_version(self) -> int:
        self._check_open()
        version = await self._pool.call(schema.schema_version, "read")
        assert version is not None
        return version

    async def close(self) -> None:
        """Finish the queued operations, then close the connections and stop the threads."""
        if self._closed:
            return
        self._closed = True
        self._pool.stop()
        await asyncio.to_thread(self._pool.join)


def _initialize(conn: psycopg.Connection[Any], clock: ServerClock | None) -> None:
    """Runs on a worker before any operation: migrations, schema shape, the clock's first sample."""
    schema.migrate(conn)
    schema.check_schema_shape(conn, schema.expected_columns())
    if clock is not None:
        clock.sample(conn)
