"""Topics: a named, fixed set of partitions, each one s3stream stream, recorded in the engine's KV.

KV layout (``docs/spark-sink.md`` section "Engine state"):

- ``spark_sink/topic/<topic>`` -> JSON ``{"version": 1, "partitions": N}``
- ``spark_sink/topic/<topic>/partition/<i>`` -> the stream id of partition ``i`` (decimal ASCII)

Creation is crash-safe: a stream is created first and then claimed with ``put_if_absent``; a crash
in between leaves an unclaimed empty stream (tagged with the topic), never two claimed ones.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass

from s3stream.errors import CorruptionError, InvalidArgumentError
from s3stream.facade import SyncClient, SyncStream
from s3stream.ids import StreamId

TOPIC_VERSION = 1
PARTITION_MAX_COUNT = 10_000
_TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]{1,200}$")


def topic_key(topic: str) -> str:
    return f"spark_sink/topic/{topic}"


def partition_key(topic: str, partition: int) -> str:
    return f"spark_sink/topic/{topic}/partition/{partition}"


def check_topic_name(topic: str) -> None:
    if not isinstance(topic, str) or not _TOPIC_NAME.match(topic):
        raise InvalidArgumentError(f"topic name {topic!r} must be 1-200 characters of [A-Za-z0-9._-]")


@dataclass(frozen=True, slots=True)
class Topic:
    name: str
    stream_ids: tuple[StreamId, ...]
    """Index = partition."""

    @property
    def partition_count(self) -> int:
        return len(self.stream_ids)


def describe_topic(client: SyncClient, topic: str) -> Topic | None:
    """The topic's streams, or None if it was never created."""
    return topic_from_kv(client.kv.get, topic)


def topic_from_kv(get: Callable[[str], bytes | None], topic: str) -> Topic | None:
    """The topic's streams read through ``get`` (a KV lookup: a client's, or a reader's of shared
    metadata), or None if it was never created (or its creation was interrupted)."""
    check_topic_name(topic)
    raw = get(topic_key(topic))
    if raw is None:
        return None
    count = _decode_topic(raw, topic)
    ids: list[StreamId] = []
    for i in range(count):
        sid = get(partition_key(topic, i))
        if sid is None:
            return None  # creation was interrupted: ensure_topic finishes it
        ids.append(_decode_stream_id(sid, partition_key(topic, i)))
    return Topic(topic, tuple(ids))


def ensure_topic(client: SyncClient, topic: str, partition_count: int) -> Topic:
    """Create the topic (idempotently) or check the existing one has ``partition_count`` partitions."""
    check_topic_name(topic)
    if isinstance(partition_count, bool) or not isinstance(partition_count, int):
        raise InvalidArgumentError(f"partitions must be an int, got {partition_count!r}")
    if not 1 <= partition_count <= PARTITION_MAX_COUNT:
        raise InvalidArgumentError(f"partitions must be in [1, {PARTITION_MAX_COUNT}], got {partition_count}")
    wanted = json.dumps({"version": TOPIC_VERSION, "partitions": partition_count}).encode()
    client.kv.put_if_absent(topic_key(topic), wanted)
    stored = client.kv.get(topic_key(topic))
    assert stored is not None
    existing = _decode_topic(stored, topic)
    if existing != partition_count:
        raise InvalidArgumentError(
            f"topic {topic!r} exists with {existing} partitions, the sink was configured with {partition_count}"
        )
    ids: list[StreamId] = []
    for i in range(partition_count):
        key = partition_key(topic, i)
        raw = client.kv.get(key)
        if raw is None:
            sid = client.streams.create_stream(
                tags={"spark_sink.topic": topic, "spark_sink.partition": str(i)}
            )
            client.kv.put_if_absent(key, str(int(sid)).encode())
            raw = client.kv.get(key)
            assert raw is not None
        ids.append(_decode_stream_id(raw, key))
    return Topic(topic, tuple(ids))


def open_partitions(client: SyncClient, topic: Topic) -> list[SyncStream]:
    """Open every partition's stream for writing, with the epoch the stream already has (0 if new).

    One sink per topic at a time: the epoch is kept, so a second live writer on the same engine is
    refused by the engine (the stream is already open in this client) rather than fenced.
    """
    metas = {m.stream_id: m for m in client.streams.list_streams()}
    streams: list[SyncStream] = []
    for sid in topic.stream_ids:
        meta = metas.get(sid)
        if meta is None:
            raise CorruptionError(
                f"topic {topic.name!r} names stream {sid}, which does not exist", source="kv"
            )
        streams.append(client.streams.open_stream(sid, epoch=max(meta.epoch, 0)))
    return streams


def _decode_topic(raw: bytes, topic: str) -> int:
    try:
        obj = json.loads(raw)
        if obj["version"] != TOPIC_VERSION:
            raise ValueError(f"version {obj['version']}")
        count = int(obj["partitions"])
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptionError(f"bad topic record: {exc}", source=f"kv:{topic_key(topic)}") from exc
    if not 1 <= count <= PARTITION_MAX_COUNT:
        raise CorruptionError(f"bad topic partition count {count}", source=f"kv:{topic_key(topic)}")
    return count


def _decode_stream_id(raw: bytes, key: str) -> StreamId:
    try:
        value = int(raw.decode("ascii"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise CorruptionError(f"bad stream id {raw!r}", source=f"kv:{key}") from exc
    if value < 0:
        raise CorruptionError(f"negative stream id {value}", source=f"kv:{key}")
    return StreamId(value)
