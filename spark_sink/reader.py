"""Batch read of a topic into a DataFrame: the driver fetches payloads, the executors decode them.

The driver fetches whole Kafka RecordBatch payloads from the partitions' streams (no per-record
work), hands them to Spark as one Arrow table, and ``mapInArrow`` decodes the records into the
columns of :data:`READ_DDL` on the executors, keeping only offsets inside the requested ranges.

Read-committed: a partition is readable up to the end offset the sink committed with the last chunk
of its last finished micro-batch (:class:`~spark_sink.protocol.Committed`), never further; the
chunks of an unfinished micro-batch stay invisible until its replay completes it, and the ranges
``spark_sink abandon`` discarded (behind the committed ends) are skipped.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from s3stream.errors import InvalidArgumentError, NotFoundError, OffsetOutOfRangeError, UnavailableError
from s3stream.facade import SyncClient, SyncStream
from spark_sink.direct import read_committed_record
from spark_sink.kafka_codec import KafkaRecord, decode_batch
from spark_sink.protocol import Committed
from spark_sink.topic import Topic, describe_topic, open_partitions

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from spark_sink.sink import S3StreamSink

READ_DDL = (
    "topic string, partition int, offset bigint, timestamp timestamp, key binary, value binary, "
    "headers array<struct<key: string, value: binary>>"
)
_HEADER_TYPE = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
READ_SCHEMA = pa.schema(
    [
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("headers", _HEADER_TYPE),
    ]
)
_PAYLOAD_SCHEMA = pa.schema(
    [
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("stream_id", pa.int64()),
        pa.field("base_offset", pa.int64()),
        pa.field("start_offset", pa.int64()),  # keep records in [start_offset, end_offset)
        pa.field("end_offset", pa.int64()),
        pa.field("payload", pa.binary()),
    ]
)
FETCH_MAX_BYTES = 8 << 20


@dataclass(frozen=True, slots=True)
class PartitionRange:
    """Offsets ``[start_offset, end_offset)`` of one partition."""

    partition: int
    start_offset: int
    end_offset: int


def _streams_for(
    source: S3StreamSink | SyncClient, topic_name: str
) -> tuple[SyncClient, Topic, list[SyncStream]]:
    from spark_sink.sink import S3StreamSink

    if isinstance(source, S3StreamSink) and source.topic_name == topic_name:
        streams = source._ensure_streams()
        assert source._topic is not None
        return source.client, source._topic, streams
    client = source.client if isinstance(source, S3StreamSink) else source
    topic = describe_topic(client, topic_name)
    if topic is None:
        raise NotFoundError(f"topic {topic_name!r} does not exist")
    return client, topic, open_partitions(client, topic)


COMMIT_WAIT_S_MAX = 2.0
"""How long a reader waits for a stream's confirm offset to reach a just-committed end."""


def read_committed(client: SyncClient, topic: Topic, streams: list[SyncStream]) -> Committed:
    """The topic's committed record (nothing committed where no micro-batch completed).

    The KV record is read before the streams' confirm offsets: the engine applies the record and
    advances the confirm offsets of one ``append_atomic`` at about the same moment, so a reader can
    briefly see the record ahead; it waits for the streams (at most :data:`COMMIT_WAIT_S_MAX`).
    """
    committed = read_committed_record(client, topic.name, topic.partition_count)  # either path's
    deadline = time.monotonic() + COMMIT_WAIT_S_MAX
    for p, stream in enumerate(streams):
        while stream.confirm_offset < committed.ends[p]:
            if time.monotonic() > deadline:
                raise UnavailableError(
                    f"topic {topic.name!r} partition {p}: committed end {committed.ends[p]} is above the "
                    f"stream's confirm offset {stream.confirm_offset} after {COMMIT_WAIT_S_MAX} s"
                )
            time.sleep(0.001)
    return committed


def fetch_payloads(
    source: S3StreamSink | SyncClient,
    topic_name: str,
    ranges: Mapping[int, tuple[int, int]] | None = None,
) -> tuple[pa.Table, list[PartitionRange]]:
    """The payloads covering ``ranges`` (partition -> (start, end); default: everything committed).

    Ranges discarded by ``spark_sink abandon`` are left out: the returned :class:`PartitionRange`
    list holds the readable pieces (several per partition around a discarded range), and each
    payload row carries the piece it belongs to. Streams opened here for a client stay open (a
    client opens a stream once); the sink's own streams are reused.
    """
    client, topic, streams = _streams_for(source, topic_name)
    committed = read_committed(client, topic, streams)
    ends = committed.ends
    if ranges is None:
        asked = [(p, min(s.start_offset, ends[p]), ends[p]) for p, s in enumerate(streams)]
    else:
        asked = []
        for p, (start, end) in sorted(ranges.items()):
            if not 0 <= p < topic.partition_count:
                raise InvalidArgumentError(f"topic {topic_name!r} has no partition {p}")
            if start > end:
                raise InvalidArgumentError(f"partition {p}: start offset {start} > end offset {end}")
            asked.append((p, start, end))
    wanted: list[PartitionRange] = []
    for p, start, end in asked:
        if start < streams[p].start_offset or end > ends[p]:
            raise OffsetOutOfRangeError(
                f"partition {p}: [{start}, {end}) is outside the committed "
                f"[{streams[p].start_offset}, {ends[p]})"
            )
        pieces = committed.readable(p, start, end) or [(end, end)]  # an empty range names its partition
        wanted.extend(PartitionRange(p, lo, hi) for lo, hi in pieces)
    cols: dict[str, list[object]] = {name: [] for name in _PAYLOAD_SCHEMA.names}
    for r in wanted:
        stream = streams[r.partition]
        pos = r.start_offset
        while pos < r.end_offset:
            batches = stream.fetch(pos, r.end_offset, FETCH_MAX_BYTES)
            if not batches:
                raise OffsetOutOfRangeError(f"partition {r.partition}: nothing returned at offset {pos}")
            for b in batches:
                cols["topic"].append(topic_name)
                cols["partition"].append(r.partition)
                cols["stream_id"].append(int(stream.stream_id))
                cols["base_offset"].append(b.base_offset)
                cols["start_offset"].append(r.start_offset)
                cols["end_offset"].append(r.end_offset)
                cols["payload"].append(b.payload)
            pos = batches[-1].end_offset
    return pa.Table.from_pydict(cols, schema=_PAYLOAD_SCHEMA), wanted


def decode_payload_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` body: payload rows in, one row per Kafka record in range out."""
    for rb in batches:
        out: dict[str, list[object]] = {name: [] for name in READ_SCHEMA.names}
        topics = rb.column("topic").to_pylist()
        parts = rb.column("partition").to_pylist()
        sids = rb.column("stream_id").to_pylist()
        bases = rb.column("base_offset").to_pylist()
        los = rb.column("start_offset").to_pylist()
        his = rb.column("end_offset").to_pylist()
        payloads = rb.column("payload").to_pylist()
        for i, payload in enumerate(payloads):
            decoded, end = decode_batch(
                payload, source=f"stream {sids[i]} offset {bases[i]}", base_offset=bases[i]
            )
            if end != len(payload):
                decoded_more = len(payload) - end
                raise ValueError(f"stream {sids[i]} offset {bases[i]}: {decoded_more} bytes after the batch")
            lo, hi = los[i], his[i]
            offsets = decoded.offsets
            a = 0
            b = len(offsets)
            if offsets and (offsets[0] < lo or offsets[-1] >= hi):
                keep = [j for j, o in enumerate(offsets) if lo <= o < hi]
                a, b = (keep[0], keep[-1] + 1) if keep else (0, 0)
            n = b - a
            out["topic"].extend([topics[i]] * n)
            out["partition"].extend([parts[i]] * n)
            out["offset"].extend(offsets[a:b])
            out["timestamp"].extend(t * 1000 for t in decoded.timestamps_ms[a:b])
            out["key"].extend(decoded.keys[a:b])
            out["value"].extend(decoded.values[a:b])
            out["headers"].extend([{"key": k, "value": v} for k, v in h] for h in decoded.headers[a:b])
        yield pa.RecordBatch.from_pydict(out, schema=READ_SCHEMA)


def read_topic(
    spark: SparkSession,
    source: S3StreamSink | SyncClient,
    topic: str,
    ranges: Mapping[int, tuple[int, int]] | None = None,
) -> DataFrame:
    """A DataFrame of the records of ``topic`` (columns of :data:`READ_DDL`, like Kafka's source).

    ``source`` is the sink that wrote the topic (its engine and open streams are reused) or an open
    client. ``ranges`` maps partition -> ``(start_offset, end_offset)``; default: all readable data.
    """
    table, _ = fetch_payloads(source, topic, ranges)
    if table.num_rows == 0:
        return spark.createDataFrame([], READ_DDL)
    payloads = spark.createDataFrame(table)
    return payloads.mapInArrow(decode_payload_batches, READ_DDL)


def read_records(
    source: S3StreamSink | SyncClient,
    topic: str,
    ranges: Mapping[int, tuple[int, int]] | None = None,
) -> dict[int, list[KafkaRecord]]:
    """The records of ``topic`` per partition, decoded in this process (small volumes: tests, demo)."""
    table, wanted = fetch_payloads(source, topic, ranges)
    out: dict[int, list[KafkaRecord]] = {r.partition: [] for r in wanted}
    for row in table.to_pylist():
        part = row["partition"]
        lo, hi = row["start_offset"], row["end_offset"]
        decoded, _ = decode_batch(
            row["payload"],
            source=f"stream {row['stream_id']} offset {row['base_offset']}",
            base_offset=row["base_offset"],
        )
        out[part].extend(r for r in decoded.records() if lo <= r.offset < hi)
    return out
