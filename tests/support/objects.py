"""Test helper: write record batches as one object and commit it as a StreamSet object."""

from __future__ import annotations

from collections.abc import Sequence

from s3stream.engine.upload import ObjectUploader
from s3stream.ids import NodeId, ObjectId
from s3stream.metadata.base import CommitStreamSetObjectRequest, MetadataStore
from s3stream.metadata.memory import MemoryMetadataStore
from s3stream.objectformat import ObjectWriter, object_key
from s3stream.objectformat.writer import DEFAULT_PART_SIZE_BYTES
from s3stream.record import StreamRecordBatch
from s3stream.storage.base import ObjectStorage


async def commit_stream_set_object(
    metadata: MetadataStore,
    storage: ObjectStorage,
    batches: Sequence[StreamRecordBatch],
    *,
    namespace: str,
    node_id: NodeId,
    node_epoch: int = 1,
    block_size_bytes: int,
    part_size_bytes: int = DEFAULT_PART_SIZE_BYTES,
    ttl_ms: int = 60_000,
) -> ObjectId:
    """Prepare an object id, write ``batches`` (in the order given) as that object, commit it."""
    object_id = await metadata.prepare_objects(count=1, ttl_ms=ttl_ms)
    writer = ObjectWriter(
        storage.upload(object_key(object_id, namespace)),
        block_size_bytes=block_size_bytes,
        part_size_bytes=part_size_bytes,
    )
    await writer.write(list(batches))
    written = await writer.close()
    await metadata.commit_stream_set_object(
        CommitStreamSetObjectRequest(
            node_id=node_id,
            node_epoch=node_epoch,
            object_id=object_id,
            order_id=object_id,
            object_size_bytes=written.size_bytes,
            stream_ranges=written.stream_ranges,
        )
    )
    return object_id


def make_uploader(
    storage: ObjectStorage, *, block_size_bytes: int, part_size_bytes: int, **kwargs: int
) -> ObjectUploader:
    """An :class:`ObjectUploader` of node 0 in namespace ``ns`` with fresh in-memory metadata."""
    return ObjectUploader(
        storage=storage,
        metadata=MemoryMetadataStore(),
        namespace="ns",
        node_id=NodeId(0),
        node_epoch=1,
        block_size_bytes=block_size_bytes,
        part_size_bytes=part_size_bytes,
        prepared_ttl_ms=60_000,
        **kwargs,
    )
