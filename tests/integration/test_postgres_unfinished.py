"""A metadata write whose connection breaks while the server is still committing it: the store's next
operation waits until that session has ended, so what it reads is the write's final outcome.

The network drop is a TCP proxy between the store and PostgreSQL that closes both sides while the
COMMIT runs (slowed by a deferred trigger on the KV table): the server keeps working on the COMMIT,
as it would behind a real drop, and the client sees its connection broken."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import urllib.parse
from collections.abc import Iterator

import psycopg
import pytest

from s3stream.errors import UnavailableError
from s3stream.metadata import postgres_unfinished
from s3stream.metadata.postgres import PostgresMetadataStore

pytestmark = pytest.mark.integration

COMMIT_S = 1.5
"""How long the deferred trigger holds each COMMIT that wrote a KV row."""


class _Proxy:
    """Forwards one port to PostgreSQL; ``cut()`` closes every connection on both sides."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self._target)
            with self._lock:
                self._sockets += [client, server]
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)

    def cut(self) -> None:
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for s in sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def close(self) -> None:
        self._listener.close()
        self.cut()


@pytest.fixture
def proxied(pg_url: str) -> Iterator[tuple[str, _Proxy]]:
    parts = urllib.parse.urlsplit(pg_url)
    proxy = _Proxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    netloc = parts.netloc.rsplit("@", 1)
    host_port = f"127.0.0.1:{proxy.port}"
    url = parts._replace(netloc=f"{netloc[0]}@{host_port}" if len(netloc) == 2 else host_port).geturl()
    try:
        yield url, proxy
    finally:
        proxy.close()


def _slow_commits(pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            "CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS "
            f"$$ BEGIN PERFORM pg_sleep({COMMIT_S}); RETURN NULL; END $$"
        )
        conn.execute(
            "CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT OR UPDATE ON kv "
            "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit()"
        )


async def test_a_read_after_a_write_cut_during_its_commit_sees_the_final_outcome(
    pg_url: str, proxied: tuple[str, _Proxy]
) -> None:
    url, proxy = proxied
    store = await PostgresMetadataStore.open(url, connections=1)
    try:
        _slow_commits(pg_url)
        asyncio.get_running_loop().call_later(COMMIT_S / 3, proxy.cut)
        with pytest.raises(UnavailableError) as info:
            await store.kv_put("k", b"v")
        password = urllib.parse.urlsplit(pg_url).password
        assert password
        assert password not in str(info.value)
        first = await store.kv_get("k")  # waits until the cut session has ended
        await asyncio.sleep(COMMIT_S + 0.5)  # where the COMMIT would have landed
        assert await store.kv_get("k") == first
    finally:
        await store.close()


async def test_a_session_that_does_not_end_fails_the_next_operation_until_it_does(
    pg_url: str, proxied: tuple[str, _Proxy], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no time to end the cut session, the next operation fails as unavailable (and does not
    terminate it); the COMMIT then lands after the caller saw the failure, and once the session is
    gone operations run again and see it."""
    url, proxy = proxied
    monkeypatch.setattr(postgres_unfinished, "SESSION_END_WAIT_S", 0.0)
    store = await PostgresMetadataStore.open(url, connections=1)
    try:
        _slow_commits(pg_url)
        asyncio.get_running_loop().call_later(COMMIT_S / 3, proxy.cut)
        with pytest.raises(UnavailableError):
            await store.kv_put("k", b"v")
        with pytest.raises(UnavailableError, match="may still commit"):
            await store.kv_get("k")
        await asyncio.sleep(COMMIT_S + 0.5)  # the server finished the COMMIT, and the session is gone
        assert await store.kv_get("k") == b"v"
    finally:
        await store.close()
