"""The sync facade: blocking calls on a loop thread, errors unchanged, context managers."""

from __future__ import annotations

import asyncio
import signal
import threading
from pathlib import Path

import pytest

from s3stream.assembly import build_reader, open_sync
from s3stream.config import Config
from s3stream.engine.client import Client
from s3stream.engine.core import Engine
from s3stream.engine.walport import MemoryWal
from s3stream.errors import ClosedError, FencedError, InvalidArgumentError, OffsetOutOfRangeError
from s3stream.facade import SyncClient, _LoopThread
from s3stream.ids import NodeId
from s3stream.metadata.memory import MemoryMetadataStore
from s3stream.model import RecordBatch
from s3stream.storage.memory import MemoryObjectStorage
from tests.support.configs import small_config

MiB = 1 << 20
CONFIG = small_config(wal_cache_size_bytes=2 * MiB, wal_upload_threshold_bytes=256 * 1024)


def sync_client() -> SyncClient:
    """A SyncClient over an engine on the memory twins, built on the facade's own loop thread."""
    runner = _LoopThread()

    async def build() -> Client:
        metadata = MemoryMetadataStore()
        storage = MemoryObjectStorage()
        wal = MemoryWal(capacity_bytes=CONFIG.wal_capacity_bytes)
        engine = Engine(
            CONFIG,
            wal=wal,
            metadata=metadata,
            storage=storage,
            node_id=NodeId(0),
            node_epoch=1,
            reader=build_reader(CONFIG, metadata, storage),
        )
        await engine.start()
        return Client(engine, metadata, closers=[wal.close])

    return SyncClient(runner.run(build()), runner)


def test_append_fetch_trim_through_blocking_calls() -> None:
    with sync_client() as client, client.streams.create_and_open_stream() as stream:
        assert stream.append(RecordBatch(b"a")) == 0
        assert stream.append(RecordBatch(b"bc", count=2)) == 1
        assert (stream.start_offset, stream.confirm_offset, stream.next_offset) == (0, 3, 3)
        got = stream.fetch(0, 3)
        assert [(b.base_offset, b.count, b.payload) for b in got] == [(0, 1, b"a"), (1, 2, b"bc")]
        stream.trim(1)
        assert stream.start_offset == 1
        assert [m.stream_id for m in client.streams.list_streams()] == [stream.stream_id]


def test_errors_come_back_unchanged() -> None:
    with sync_client() as client:
        stream = client.streams.create_and_open_stream(epoch=3)
        stream.append(RecordBatch(b"x"))
        with pytest.raises(OffsetOutOfRangeError):
            stream.fetch(0, 5)
        with pytest.raises(InvalidArgumentError):
            stream.append(RecordBatch(b""))
        stream.close()
        with pytest.raises(FencedError):
            client.streams.open_stream(stream.stream_id, epoch=2)
        reopened = client.streams.open_stream(stream.stream_id, epoch=4)
        assert reopened.epoch == 4
        assert [b.payload for b in reopened.fetch(0, 1)] == [b"x"]


def test_kv_client() -> None:
    with sync_client() as client:
        assert client.kv.get("k") is None
        assert client.kv.put_if_absent("k", b"1") == b"1"
        assert client.kv.put_if_absent("k", b"2") == b"1"
        assert client.kv.put("k", b"3") == b"3"
        assert client.kv.delete("k") == b"3"
        assert client.kv.get("k") is None


def test_append_atomic_across_streams_and_kv() -> None:
    with sync_client() as client:
        a = client.streams.create_and_open_stream()
        b = client.streams.create_and_open_stream()
        offsets = client.append_atomic([(a, RecordBatch(b"1")), (b, RecordBatch(b"2"))], kv={"ck": b"v"})
        assert offsets == [0, 0]
        assert client.kv.get("ck") == b"v"
        assert [x.payload for x in b.fetch(0, 1)] == [b"2"]


def test_closed_client_stops_its_loop_thread_and_refuses_calls() -> None:
    client = sync_client()
    stream = client.streams.create_and_open_stream()
    thread_names = {t.name for t in threading.enumerate()}
    assert "s3stream-sync-loop" in thread_names
    client.close()
    client.close()  # idempotent
    assert client.loop.is_closed()
    with pytest.raises(ClosedError):
        stream.append(RecordBatch(b"late"))
    with pytest.raises(ClosedError):
        client.kv.get("k")


def test_call_from_the_loop_thread_is_refused() -> None:
    with sync_client() as client:
        stream = client.streams.create_and_open_stream()
        failures: list[BaseException] = []

        def inside() -> None:
            try:
                stream.append(RecordBatch(b"x"))
            except InvalidArgumentError as exc:
                failures.append(exc)

        client.loop.call_soon_threadsafe(inside)
        assert stream.next_offset == 0  # runs after `inside` on the loop: nothing was appended
        assert len(failures) == 1


def test_open_sync_on_an_embedded_data_dir_survives_a_reopen(tmp_path: Path) -> None:
    config = Config(
        wal_capacity_bytes=16 * MiB,
        wal_record_max_bytes=1 * MiB,
        record_max_bytes=512 * 1024,
        wal_cache_size_bytes=4 * MiB,
        wal_upload_threshold_bytes=1 * MiB,
    )
    with open_sync(tmp_path / "data", config=config) as client:
        stream = client.streams.create_and_open_stream(tags={"name": "t"})
        offsets = [stream.append(RecordBatch(f"r{i}".encode())) for i in range(5)]
        assert offsets == [0, 1, 2, 3, 4]
        stream_id = stream.stream_id
    with open_sync(tmp_path / "data", config=config) as client:
        [meta] = client.streams.list_streams()
        assert (meta.stream_id, meta.end_offset, dict(meta.tags)) == (stream_id, 5, {"name": "t"})
        with client.streams.open_stream(stream_id, epoch=meta.epoch + 1) as stream:
            assert [b.payload for b in stream.fetch(0, 5)] == [f"r{i}".encode() for i in range(5)]


class Interrupted(Exception):
    """Raised by a signal handler in the waiting thread, as KeyboardInterrupt is by SIGINT."""


def test_an_interrupted_blocking_call_cancels_its_engine_call() -> None:
    assert threading.current_thread() is threading.main_thread()  # signal handlers run here
    runner = _LoopThread()
    started, cancelled = threading.Event(), threading.Event()

    async def engine_call() -> None:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    def interrupt(signum: int, frame: object) -> None:
        raise Interrupted

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.2)
    try:
        with pytest.raises(Interrupted):
            runner.run(engine_call())
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert started.is_set()
    assert cancelled.wait(5), "the engine call kept running after its caller was interrupted"
    assert runner.run(asyncio.sleep(0, result=7)) == 7  # the loop thread still serves calls
    runner.stop()


@pytest.mark.parametrize(
    ("appends", "message"),
    [
        (None, "appends must be a sequence of .* got NoneType"),
        ("stream", r"appends must be \(SyncStream, RecordBatch\) .* tuples, got SyncStream$"),
        ("async stream", r"appends must be \(SyncStream, RecordBatch\) .* got tuple of Stream"),
        ("bare stream", "appends must be a sequence of .* got SyncStream"),
    ],
)
def test_append_atomic_entries_that_are_not_sync_stream_tuples_are_invalid(
    appends: object, message: str
) -> None:
    """Before: AttributeError / TypeError from unpacking the entries (errors audit)."""
    with sync_client() as client, client.streams.create_and_open_stream() as stream:
        given: object = {
            "stream": [stream],
            "async stream": [(stream.stream, RecordBatch(b"a"))],
            "bare stream": stream,
        }.get(appends, appends)  # type: ignore[call-overload]
        with pytest.raises(InvalidArgumentError, match=message):
            client.append_atomic(given)  # type: ignore[arg-type]
        assert stream.next_offset == 0
