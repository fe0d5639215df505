"""How many GETs a catch-up read of cold data costs with the default settings (each GET costs the
client about as much CPU as a MiB of data, so the reader merges blocks into few, large GETs)."""

from __future__ import annotations

from s3stream.config import Config
from s3stream.engine.blockcache import BlockCache
from s3stream.engine.reader import ObjectStreamReader
from s3stream.engine.readplan import LOAD_TAIL_DIVISOR, MERGED_GET_MAX_BYTES
from s3stream.engine.readstate import ReadaheadSettings
from s3stream.ids import NodeId
from s3stream.metadata.memory import MemoryMetadataStore
from s3stream.objectformat import DataBlock, ObjectReaderCache
from s3stream.record import StreamRecordBatch
from s3stream.storage.memory import MemoryObjectStorage
from tests.support.objects import commit_stream_set_object

MiB = 1 << 20
NS = "gets"
NODE = NodeId(0)


class CountingStorage(MemoryObjectStorage):
    def __init__(self) -> None:
        super().__init__("gets")
        self.get_sizes: list[int] = []

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        data = await super().get(key, start, end)
        self.get_sizes.append(len(data))
        return data


async def test_a_catch_up_read_of_16_mib_objects_takes_few_large_gets() -> None:
    config = Config()
    storage = CountingStorage()
    metadata = MemoryMetadataStore()
    await metadata.register_node(node_id=NODE, node_epoch=1)
    stream_id = await metadata.create_stream(node_id=NODE, node_epoch=1)
    await metadata.open_stream(node_id=NODE, node_epoch=1, stream_id=stream_id, epoch=0)
    payload = bytes(range(256)) * 256  # 64 KiB records
    object_count, per_object = 4, 256  # 16 MiB objects
    for o in range(object_count):
        base = o * per_object
        await commit_stream_set_object(
            metadata,
            storage,
            [StreamRecordBatch(stream_id, 0, base + i, 1, payload) for i in range(per_object)],
            namespace=NS,
            node_id=NODE,
            block_size_bytes=config.object_block_size_bytes,
        )
    reader = ObjectStreamReader(
        metadata,
        storage,
        namespace=NS,
        block_cache=BlockCache[DataBlock](config.block_cache_size_bytes),
        reader_cache=ObjectReaderCache(storage),
    )
    end = object_count * per_object
    storage.get_sizes.clear()
    offset = 0
    while offset < end:
        batches = await reader.read(stream_id, offset, end, MiB)
        assert batches
        assert batches[0].base_offset == offset
        offset = batches[-1].end_offset
    await reader.close()
    data_gets = [s for s in storage.get_sizes if s > 64 * 1024]  # the rest are the objects' tails
    assert sum(data_gets) >= object_count * 16 * MiB
    load_max_bytes = ReadaheadSettings().load_max_bytes
    # a load, with the rest of its object it may take along, is one merged GET
    assert load_max_bytes + load_max_bytes // LOAD_TAIL_DIVISOR == MERGED_GET_MAX_BYTES
    # 4 MiB GETs took 28 here, 8 MiB ones 19; loads that stop where objects end and take a short
    # rest of their object along take 14: the start-up ramp, then two an object (7.5 + 8.5 MiB)
    assert len(data_gets) <= 15, [s >> 10 for s in data_gets]
