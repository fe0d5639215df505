"""Server sessions whose write transaction may still commit after its caller saw the connection break.

A client that loses its connection while a write transaction is open, COMMIT sent or not, cannot
tell whether it committed: the server may have the COMMIT and still be working on it (flushing its
WAL, waiting for a synchronous standby), and it commits whatever happens to the client. A caller
told "unavailable" then reads the state to settle what happened (decision 0049); a read that runs
before that COMMIT lands sees the old state, and the caller settles on the wrong outcome.

So the pool remembers each such session (its backend's pid and start time, which together name one
session for the server's life) and, before any later operation, ends it (``pg_terminate_backend``
makes a backend that is idle or waiting exit; a COMMIT already under way finishes first, as the
server never interrupts it half-done) and waits until the server lists it no more. From then on
every transaction of the process sees that write's final outcome. While the server cannot be reached
no operation runs anyway; a session that does not go within ``SESSION_END_WAIT_S`` fails the
operation (UnavailableError, retriable) and is waited for again by the next one.

Invariant: no operation of the pool starts while a session that ran one of its writes with an
unreported outcome is still alive on the server.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from s3stream.errors import UnavailableError

SESSION_END_WAIT_S = 10.0
"""How long an operation waits for such sessions to end before it fails."""
POLL_S = 0.005


@dataclass(frozen=True, slots=True)
class Session:
    """One server session: its backend's process id and start time."""

    pid: int
    started: datetime


def session_of(conn: psycopg.Connection[Any]) -> Session:
    """The server session of a freshly opened connection (outside any transaction)."""
    row = conn.execute(
        "SELECT pid, backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()"
    ).fetchone()
    if row is None:  # pragma: no cover - the server always lists the session asking
        raise UnavailableError("the metadata database does not list this connection's session")
    return Session(int(row[0]), row[1])


class UnfinishedSessions:
    """The sessions of a pool whose last write's outcome its caller did not learn (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sessions: set[Session] = set()

    def __bool__(self) -> bool:
        return bool(self._sessions)

    def add(self, session: Session) -> None:
        with self._lock:
            self._sessions.add(session)

    def wait_ended(self, conn: psycopg.Connection[Any]) -> None:
        """End every remembered session and wait until the server lists none of them (``conn`` is
        another, healthy connection, outside any transaction)."""
        with self._lock:
            pending = set(self._sessions)
        if not pending:
            return
        deadline = time.monotonic() + SESSION_END_WAIT_S
        alive = pending
        terminated: set[Session] = set()
        while True:
            alive = {s for s in alive if _listed(conn, s)}
            if not alive:
                break
            if time.monotonic() >= deadline:
                pids = ", ".join(str(s.pid) for s in sorted(alive, key=lambda s: s.pid))
                raise UnavailableError(
                    f"a metadata write whose connection broke may still commit on the server (backend pid "
                    f"{pids} did not end within {SESSION_END_WAIT_S:g} s)"
                )
            for session in alive - terminated:
                conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid = %s AND backend_start = %s",
                    (session.pid, session.started),
                )
                terminated.add(session)
            time.sleep(POLL_S)
        with self._lock:
            self._sessions -= pending


def _listed(conn: psycopg.Connection[Any], session: Session) -> bool:
    row = conn.execute(
        "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND backend_start = %s", (session.pid, session.started)
    ).fetchone()
    return row is not None
