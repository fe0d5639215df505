"""The engine against a dict model: append, atomic append, fetch, trim, close/reopen, upload, restart.

The model is, per stream, the list of acknowledged batches and the start offset. After any sequence
of operations (including crashes that abandon the engine and restart it on the same WAL, metadata
and storage), every fetch returns exactly the model's batches, contiguous and in order.
"""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from s3stream.assembly import build_reader
from s3stream.config import Config
from s3stream.engine.client import Client, Stream
from s3stream.engine.core import Engine
from s3stream.engine.walport import MemoryWal
from s3stream.ids import NodeId
from s3stream.metadata.memory import MemoryMetadataStore
from s3stream.model import RecordBatch
from s3stream.storage.memory import MemoryObjectStorage

KiB = 1024
CONFIG = Config(
    wal_capacity_bytes=16 * 1024 * KiB,
    wal_record_max_bytes=1024 * KiB,
    record_max_bytes=64 * KiB,
    wal_cache_size_bytes=1024 * KiB,
    wal_upload_threshold_bytes=64 * KiB,
    wal_upload_interval_ms=60_000,
    upload_retry_backoff_ms=1,
    upload_retry_backoff_max_ms=5,
    append_backpressure_wait_ms=5_000,
    stream_object_split_size_bytes=16 * KiB,
)
STREAMS = 3

payloads = st.binary(min_size=1, max_size=6 * KiB)


class EngineMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.wal = MemoryWal(capacity_bytes=CONFIG.wal_capacity_bytes)
        self.metadata = MemoryMetadataStore()
        self.storage = MemoryObjectStorage()
        self.node_epoch = 0
        self.client: Client | None = None
        self.streams: dict[int, Stream] = {}
        self.model: dict[int, list[tuple[int, int, bytes]]] = {}
        self.start: dict[int, int] = {}
        self.epochs: dict[int, int] = {}

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    async def _open_client(self) -> Client:
        self.node_epoch += 1
        engine = Engine(
            CONFIG,
            wal=self.wal.reopen(),
            metadata=self.metadata,
            storage=self.storage,
            node_id=NodeId(0),
            node_epoch=self.node_epoch,
            reader=build_reader(CONFIG, self.metadata, self.storage),
        )
        await engine.start()
        return Client(engine, self.metadata)

    @initialize()
    def setup(self) -> None:
        self.client = self.run(self._open_client())
        for _ in range(STREAMS):
            stream = self.run(self.client.streams.create_and_open_stream())
            self.streams[stream.stream_id] = stream
            self.model[stream.stream_id] = []
            self.start[stream.stream_id] = 0
            self.epochs[stream.stream_id] = 0

    def next_offset(self, sid: int) -> int:
        batches = self.model[sid]
        return batches[-1][0] + batches[-1][1] if batches else 0

    async def _stream(self, sid: int) -> Stream:
        stream = self.streams.get(sid)
        if stream is None:
            assert self.client is not None
            stream = await self.client.streams.open_stream(sid, epoch=self.epochs[sid])  # type: ignore[arg-type]
            self.streams[sid] = stream
        return stream

    @rule(index=st.integers(0, STREAMS - 1), payload=payloads, count=st.integers(1, 5))
    def append(self, index: int, payload: bytes, count: int) -> None:
        sid = sorted(self.model)[index]

        async def go() -> int:
            return await (await self._stream(sid)).append(RecordBatch(payload, count))

        base = self.run(go())
        assert base == self.next_offset(sid)
        self.model[sid].append((base, count, payload))

    @rule(
        items=st.lists(st.tuples(st.integers(0, STREAMS - 1), payloads), min_size=1, max_size=4),
        value=st.binary(max_size=16),
    )
    def append_atomic(self, items: list[tuple[int, bytes]], value: bytes) -> None:
        assert self.client is not None
        sids = [sorted(self.model)[i] for i, _ in items]

        async def go() -> list[int]:
            assert self.client is not None
            pairs = [
                (await self._stream(sid), RecordBatch(p)) for sid, (_, p) in zip(sids, items, strict=True)
            ]
            return await self.client.append_atomic(pairs, kv={"last": value})

        bases = self.run(go())
        for sid, (_, payload), base in zip(sids, items, bases, strict=True):
            assert base == self.next_offset(sid)
            self.model[sid].append((base, 1, payload))
        assert self.run(self.client.kv.get("last")) == value

    @rule(index=st.integers(0, STREAMS - 1), data=st.data())
    def fetch(self, index: int, data: st.DataObject) -> None:
        sid = sorted(self.model)[index]
        end_max = self.next_offset(sid)
        start = data.draw(st.integers(self.start[sid], end_max))
        end = data.draw(st.integers(start, end_max))
        max_bytes = data.draw(st.sampled_from([1, 4 * KiB, 1 << 30]))

        async def go() -> list[Any]:
            return await (await self._stream(sid)).fetch(start, end, max_bytes)

        got = self.run(go())
        expected = [b for b in self.model[sid] if b[0] + b[1] > start and b[0] < end]
        if start == end:
            assert got == []
            return
        assert got, "at least one batch"
        assert [(b.base_offset, b.count, b.payload) for b in got] == expected[: len(got)]
        if max_bytes == 1 << 30:
            assert len(got) == len(expected)

    @rule(index=st.integers(0, STREAMS - 1), data=st.data())
    def trim(self, index: int, data: st.DataObject) -> None:
        sid = sorted(self.model)[index]
        new_start = data.draw(st.integers(0, self.next_offset(sid)))

        async def go() -> None:
            await (await self._stream(sid)).trim(new_start)

        self.run(go())
        self.start[sid] = max(self.start[sid], new_start)

    @rule(index=st.integers(0, STREAMS - 1))
    def close_stream(self, index: int) -> None:
        sid = sorted(self.model)[index]
        stream = self.streams.pop(sid, None)
        if stream is not None:
            self.run(stream.close())

    @rule()
    def upload_now(self) -> None:
        assert self.client is not None
        self.run(self.client.engine.force_upload(None))

    @rule()
    def drop_cache(self) -> None:
        assert self.client is not None
        self.run(self.client.engine.force_upload(None))
        self.client.engine.cache.try_real_free(target_bytes=0)

    @rule(clean=st.booleans())
    def restart(self, clean: bool) -> None:
        assert self.client is not None
        if clean:
            self.run(self.client.close())
        else:
            self.client.engine.abandon()  # crash: keep the WAL, upload nothing
        self.streams.clear()
        self.client = self.run(self._open_client())

    @precondition(lambda self: self.client is not None)
    @invariant()
    def offsets_match(self) -> None:
        for sid, stream in self.streams.items():
            assert stream.next_offset == stream.confirm_offset == self.next_offset(sid)
            assert stream.start_offset == self.start[sid]

    def teardown(self) -> None:
        if self.client is not None:
            self.run(self.client.close())
        self.loop.close()


EngineMachine.TestCase.settings = settings(
    max_examples=40,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestEngineStateful = EngineMachine.TestCase
