"""The upload encodes a LogCache block from its columns (``ObjectWriter.write_columns`` /
``write_streams``): the same bytes as ``write`` with StreamRecordBatch objects, the same checks, far
fewer writer calls, and the plan and commit ranges read from the columns in turns."""

from __future__ import annotations

import asyncio
import itertools
import random
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from s3stream.engine import pipeline, upload
from s3stream.engine.logcache import LogCache, LogCacheBlock
from s3stream.engine.upload import ObjectUploader, StreamGroup, plan_upload
from s3stream.errors import ClosedError, InvalidArgumentError
from s3stream.ids import NodeId, ObjectId
from s3stream.metadata.memory import MemoryMetadataStore
from s3stream.objectformat import ObjectWriter, object_key
from s3stream.record import StreamRecordBatch
from s3stream.storage.memory import MemoryObjectStorage
from tests.support.objects import make_uploader


@dataclass
class Columns:
    """A RecordColumns (what the LogCache's StreamCache offers) built by hand."""

    stream_id: int
    epoch: int | None
    epochs: Sequence[int] | None
    bases: Sequence[int]
    end: int
    payloads: Sequence[bytes]

    def batches(self) -> list[StreamRecordBatch]:
        ends = [*self.bases[1:], self.end]
        return [
            StreamRecordBatch(
                self.stream_id,
                self.epoch if self.epochs is None else self.epochs[i],
                base,
                ends[i] - base,
                self.payloads[i],
            )
            for i, base in enumerate(self.bases)
        ]


def random_streams(rng: random.Random) -> list[Columns]:
    streams: list[Columns] = []
    for stream_id in sorted(rng.sample(range(1000), rng.randint(1, 20))):
        offset = rng.randint(0, 100)
        bases = array("q")
        payloads = []
        for _ in range(rng.randint(1, 30)):
            bases.append(offset)
            payloads.append(rng.randbytes(rng.randint(0, 3000)))
            offset += rng.randint(1, 5)
        mixed = rng.random() < 0.2
        epochs = array("q", [rng.randint(1, 3) for _ in bases]) if mixed else None
        streams.append(Columns(stream_id, None if mixed else 3, epochs, bases, offset, payloads))
    return streams


async def write_plain(storage: MemoryObjectStorage, key: str, streams: list[Columns], **sizes: int) -> int:
    writer = ObjectWriter(storage.upload(key), **sizes)
    await writer.write([b for s in streams for b in s.batches()])
    return (await writer.close()).size_bytes


@pytest.mark.parametrize("seed", range(12))
async def test_write_columns_and_write_streams_match_write_byte_for_byte(seed: int) -> None:
    rng = random.Random(seed)
    streams = random_streams(rng)
    sizes = {
        "block_size_bytes": rng.choice((1, 512, 4096, 1 << 20)),
        "part_size_bytes": rng.choice((1, 1 << 20)),
    }
    storage = MemoryObjectStorage()
    size = await write_plain(storage, "plain", streams, **sizes)

    by_slices = ObjectWriter(storage.upload("slices"), **sizes)
    for s in streams:  # each stream cut at random points
        cuts = sorted({0, len(s.bases), *(rng.randint(0, len(s.bases)) for _ in range(2))})
        for start, end in itertools.pairwise(cuts):
            await by_slices.write_columns(s, start, end)
    assert await by_slices.finish() == size

    by_runs = ObjectWriter(storage.upload("runs"), **sizes)
    cut = rng.randint(0, len(streams))
    await by_runs.write_streams(streams[:cut])
    await by_runs.write_streams(streams[cut:])
    written = await by_runs.close()
    assert written.size_bytes == size

    plain = await storage.get("plain")
    assert await storage.get("slices") == plain
    assert await storage.get("runs") == plain


@pytest.mark.parametrize(
    "streams",
    [
        [Columns(5, 1, None, array("q", [10, 10]), 12, [b"a", b"b"])],  # a record of count 0
        [Columns(5, 1, None, array("q", [10, 12]), 12, [b"a", b"b"])],  # the last one of count 0
        [Columns(5, 1, None, array("q", [10]), 11, [b"a"]), Columns(4, 1, None, array("q", [0]), 1, [b"a"])],
        [Columns(5, 1, None, array("q", [10]), 11, [b"a"]), Columns(5, 1, None, array("q", [5]), 6, [b"a"])],
        [Columns(-1, 1, None, array("q", [0]), 1, [b"a"])],
        [Columns(5, 1, None, array("q", [-3]), 1, [b"a"])],
    ],
)
async def test_write_streams_rejects_what_write_rejects_and_closes_the_writer(streams: list[Columns]) -> None:
    writer = ObjectWriter(MemoryObjectStorage().upload("k"))
    with pytest.raises(InvalidArgumentError):
        await writer.write_streams(streams)
    with pytest.raises(ClosedError):
        await writer.write_streams([Columns(9, 1, None, array("q", [0]), 1, [b"x"])])


def block_of(stream_count: int, records_per_stream: int, payload_bytes: int = 100) -> LogCacheBlock:
    cache = LogCache(capacity_bytes=1 << 30, upload_threshold_bytes=1 << 29, max_stream_count=1 << 20)
    payload = bytes(payload_bytes)
    for r in range(records_per_stream):
        for s in range(stream_count):
            cache.put_plain(s, 7, r, 1, payload, 0)
    block = cache.archive(0.0)
    assert block is not None
    return block


def uploader(storage: MemoryObjectStorage) -> ObjectUploader:
    return make_uploader(storage, block_size_bytes=4096, part_size_bytes=1 << 20)


async def test_an_upload_from_columns_writes_the_objects_and_ranges_of_one_from_records() -> None:
    block = block_of(300, 5, payload_bytes=900)
    group = await pipeline._streams_of(block)
    assert None not in group.columns
    records_only = StreamGroup.of_columns(group.stream_ids, group.records, group.payload_bytes)
    storage = MemoryObjectStorage()
    split = 4000  # streams of 4,500 payload bytes: every fourth one gets a stream object
    a = await uploader(storage).write(
        plan_upload(group.take(range(0, 300, 2)), split_size_bytes=1 << 20), ObjectId(1)
    )
    b = await uploader(storage).write(
        plan_upload(records_only.take(range(0, 300, 2)), split_size_bytes=1 << 20), ObjectId(2)
    )
    assert a.stream_ranges == b.stream_ranges
    assert a.object_size_bytes == b.object_size_bytes
    assert await storage.get(object_key(ObjectId(1), "ns")) == await storage.get(
        object_key(ObjectId(2), "ns")
    )
    c = await uploader(storage).write(plan_upload(group.take([0, 1]), split_size_bytes=split), ObjectId(10))
    d = await uploader(storage).write(
        plan_upload(records_only.take([0, 1]), split_size_bytes=split), ObjectId(20)
    )
    assert [(o.stream_id, o.start_offset, o.end_offset, o.size_bytes) for o in c.stream_objects] == [
        (o.stream_id, o.start_offset, o.end_offset, o.size_bytes) for o in d.stream_objects
    ]
    for x, y in ((10, 20), (11, 21)):
        assert await storage.get(object_key(ObjectId(x), "ns")) == await storage.get(
            object_key(ObjectId(y), "ns")
        )


async def test_many_small_streams_are_encoded_in_a_writer_call_per_slice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    block = block_of(1000, 8, payload_bytes=1024)
    group = await pipeline._streams_of(block)
    calls = 0
    for name in ("write_streams", "write_columns", "write_fields"):
        real = getattr(ObjectWriter, name)

        def counted(real: object = real) -> object:
            async def call(self: ObjectWriter, *args: object) -> None:
                nonlocal calls
                calls += 1
                await real(self, *args)  # type: ignore[operator]

            return call

        monkeypatch.setattr(ObjectWriter, name, counted())
    storage = MemoryObjectStorage()
    await uploader(storage).write(plan_upload(group, split_size_bytes=1 << 30), ObjectId(1))
    # 8 MiB of payload in slices of WRITE_SLICE_BYTES (it was one call per stream: 1,000)
    assert calls <= 8 * 1024 * 1024 // upload.WRITE_SLICE_BYTES + 1


async def test_the_plan_reads_a_big_block_in_turns() -> None:
    block = block_of(1000, 1)
    turns = 0

    async def count_turns() -> None:
        nonlocal turns
        while True:
            await asyncio.sleep(0)
            turns += 1

    counter = asyncio.create_task(count_turns())
    await asyncio.sleep(0)
    before = turns
    group = await pipeline._streams_of(block)
    counter.cancel()
    assert turns - before >= 1000 // pipeline.PLAN_STREAMS_PER_TURN - 1
    assert list(group.stream_ids) == list(range(1000))
    assert group.payload_bytes == (100,) * 1000


class RecordingUpload:
    def __init__(self) -> None:
        self.key = "k"
        self.parts: list[object] = []

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        self.parts.append(data)

    async def complete(self) -> int:
        return sum(len(p) for p in self.parts)  # type: ignore[arg-type]

    async def abort(self) -> None:
        pass


async def test_the_writer_hands_its_parts_over_as_bytes() -> None:
    """An S3 upload keeps a ``bytes`` write by reference; a bytearray it must copy into its pages."""
    upload = RecordingUpload()
    writer = ObjectWriter(upload, block_size_bytes=4096, part_size_bytes=1)  # type: ignore[arg-type]
    block = block_of(50, 4, payload_bytes=40_000)  # 8 MB: parts of 5 MiB (the minimum)
    await writer.write_streams(list(block.streams.values()))
    size = await writer.finish()
    assert len(upload.parts) > 1
    assert all(type(p) is bytes for p in upload.parts)
    plain = MemoryObjectStorage()
    streams = [
        Columns(c.stream_id, c.epoch, c.epochs, c.bases, c.end, c.payloads) for c in block.streams.values()
    ]
    assert size == await write_plain(plain, "plain", streams, block_size_bytes=4096, part_size_bytes=1)
    assert b"".join(upload.parts) == await plain.get("plain")  # type: ignore[arg-type]


class RecordingStorage:
    def __init__(self) -> None:
        self.uploads: list[RecordingUpload] = []

    def upload(self, key: str) -> RecordingUpload:
        self.uploads.append(RecordingUpload())
        return self.uploads[-1]


async def test_an_upload_hands_its_object_over_in_pieces_of_about_a_mebibyte() -> None:
    """The writer's buffer stays small: one grown to the object's size was moved with a copy into
    fresh pages once per object (~4 ms in one loop step for 8 MiB)."""
    storage = RecordingStorage()
    writer_of = ObjectUploader(
        storage=storage,  # type: ignore[arg-type]
        metadata=MemoryMetadataStore(),
        namespace="ns",
        node_id=NodeId(0),
        node_epoch=1,
        block_size_bytes=64 << 10,
        part_size_bytes=16 << 20,
        prepared_ttl_ms=60_000,
    )
    group = await pipeline._streams_of(block_of(1000, 8, payload_bytes=1024))
    request = await writer_of.write(plan_upload(group, split_size_bytes=1 << 30), ObjectId(1))
    [upload_done] = storage.uploads
    sizes = [len(p) for p in upload_done.parts]  # type: ignore[arg-type]
    assert sum(sizes) == request.object_size_bytes
    assert len(sizes) >= 8
    assert max(sizes) <= upload.WRITER_HANDOVER_BYTES + (64 << 10) + (100 << 10)  # + a block, + the index


@pytest.mark.parametrize("handover", [1, 3000, 100_000])
async def test_a_writer_with_handover_bytes_writes_the_same_object_in_pieces(handover: int) -> None:
    rng = random.Random(handover)
    streams = [s for s in random_streams(rng) if s.epoch is not None] or [
        Columns(1, 1, None, array("q", [0]), 1, [b"x"])
    ]
    storage = MemoryObjectStorage()
    size = await write_plain(storage, "plain", streams, block_size_bytes=2048)
    recording = RecordingUpload()
    writer = ObjectWriter(recording, block_size_bytes=2048, handover_bytes=handover)  # type: ignore[arg-type]
    await writer.write_streams(streams)
    assert await writer.finish() == size
    assert b"".join(recording.parts) == await storage.get("plain")  # type: ignore[arg-type]
    assert all(len(p) <= handover + 2048 + 3000 + 100 for p in recording.parts[:-1])  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        ObjectWriter(recording, handover_bytes=0)  # type: ignore[arg-type]


async def test_a_plan_of_a_block_keeps_no_object_per_stream() -> None:
    """Each object the plan keeps through the upload is one more for the collector to count and scan
    (a view per stream made ~1.4 more young collections per 1,000-stream upload)."""
    import gc

    block = block_of(1000, 2)
    gc.collect()
    gc.disable()  # nothing moves out of the young generation meanwhile
    try:
        before = len(gc.get_objects(0))
        plan = plan_upload(await pipeline._streams_of(block), split_size_bytes=1 << 30)
        assert len(gc.get_objects(0)) - before < 100
    finally:
        gc.enable()
    assert len(plan.stream_set) == 1000
    assert plan.stream_set[999].records[1] == (999, 7, 1, 1, bytes(100))
    assert plan.stream_set[999].records[-1] == plan.stream_set[999].records[1]
    assert list(plan.stream_set[5].records[0:2]) == [(5, 7, 0, 1, bytes(100)), (5, 7, 1, 1, bytes(100))]
