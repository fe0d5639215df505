"""What the ``s3stream`` Spark source reads from shared metadata: readers, topic snapshots, object sizes.

The source never opens an engine: the driver and every executor use an ``s3stream`` reader
(:func:`s3stream.open_reader_sync`: read-only metadata, ranged GETs of objects), so it runs beside
the writer's process, on other machines, and any number of times.

A snapshot reads the topic's committed record (the newer of the driver path's and the direct
path's, :func:`~spark_sink.direct_protocol.load_committed`) first and the streams' metadata after it; a
partition's readable end is ``min(committed end, uploaded end)``. Both only grow, so the snapshot
never names a record past the committed end (read-committed), and every offset below the readable
end is in an uploaded object the executors can fetch.
"""

from __future__ import annotations

import atexit
import threading

from s3stream.errors import NotFoundError
from s3stream.remote import SyncReader
from spark_sink.direct_protocol import load_committed
from spark_sink.source_options import SourceOptions
from spark_sink.source_plan import SizedRange, TopicSnapshot
from spark_sink.source_split import ObjectSpan
from spark_sink.topic import topic_from_kv

SIZE_SLICES_MAX = 10_000
"""At most this many objects are looked at to size one partition's range for ``maxBytesPerTrigger``."""

ReaderKey = tuple[str, str | None, str | None]
"""``(metadata URL, bucket URI, namespace)``: the readers one process shares."""

_READERS: dict[ReaderKey, SyncReader] = {}
_READERS_LOCK = threading.Lock()


def reader_key(opts: SourceOptions) -> ReaderKey:
    return (opts.metadata_url, opts.bucket_uri, opts.namespace)


def shared_reader(key: ReaderKey) -> SyncReader:
    """This process's reader for ``key``, opened at the first call and closed at exit (a Python
    worker serves many tasks: it keeps its block and index caches between them)."""
    with _READERS_LOCK:
        reader = _READERS.get(key)
        if reader is None:
            reader = open_source_reader(key)
            if not _READERS:
                atexit.register(close_shared_readers)
            _READERS[key] = reader
        return reader


def close_shared_readers() -> None:
    """Close every reader :func:`shared_reader` opened in this process."""
    with _READERS_LOCK:
        readers = list(_READERS.values())
        _READERS.clear()
    for reader in readers:
        reader.close()


def open_source_reader(key: ReaderKey) -> SyncReader:
    """A new reader of ``key``'s metadata and objects."""
    from s3stream import open_reader_sync
    from s3stream.config import Config

    metadata_url, bucket_uri, namespace = key
    config = Config.from_sources(namespace=namespace) if namespace is not None else None
    return open_reader_sync(bucket_uri=bucket_uri, metadata_url=metadata_url, config=config)


def topic_snapshot(reader: SyncReader, topic: str) -> TopicSnapshot:
    """The topic's streams, committed record and readable ends now; NotFoundError for an unknown topic."""
    found = topic_from_kv(reader.kv_get, topic)
    if found is None:
        raise NotFoundError(f"s3stream source: topic {topic!r} does not exist (no sink has created it)")
    # the newer of the driver path's and the direct path's committed records
    committed = load_committed(reader.kv_get, topic, found.partition_count)
    starts: list[int] = []
    ends: list[int] = []
    for p, sid in enumerate(found.stream_ids):
        meta = reader.describe_stream(sid)
        starts.append(meta.start_offset)
        ends.append(min(committed.ends[p], meta.end_offset))
    return TopicSnapshot(topic, found.stream_ids, tuple(starts), tuple(ends), committed)


def object_sizes(
    reader: SyncReader, snap: TopicSnapshot, start: int, end: int, partition: int
) -> list[SizedRange]:
    """Size bounds of ``[start, end)`` of a partition from the objects' metadata: a stream object's
    size is its own; a StreamSet object's whole size is counted for each stream in it (an upper bound)."""
    if start >= end:
        return []
    slices = reader.run(
        reader.reader.metadata.get_objects(
            stream_id=snap.stream_ids[partition], start_offset=start, end_offset=end, limit=SIZE_SLICES_MAX
        )
    )
    return [SizedRange(s.start_offset, s.end_offset, s.size_bytes) for s in slices]


def object_spans(
    reader: SyncReader, snap: TopicSnapshot, start: int, end: int, partition: int
) -> list[ObjectSpan]:
    """The objects holding ``[start, end)`` of a partition, in offset order, with their whole sizes
    (at most :data:`SIZE_SLICES_MAX`; offsets past them are left out)."""
    if start >= end:
        return []
    slices = reader.run(
        reader.reader.metadata.get_objects(
            stream_id=snap.stream_ids[partition], start_offset=start, end_offset=end, limit=SIZE_SLICES_MAX
        )
    )
    return [ObjectSpan(int(s.object_id), s.start_offset, s.end_offset, s.size_bytes) for s in slices]
