"""The options of the ``s3stream`` Spark source, checked once on the driver (pure: no I/O).

``docs/spark-sink.md`` section "Streaming source" lists them. Offsets are Kafka's JSON form,
``{"<topic>": {"<partition>": offset}}``; in ``startingOffsets`` / ``endingOffsets`` the offset -2
means the partition's earliest readable offset and -1 its latest committed one.

Every problem is an :class:`~s3stream.errors.InvalidArgumentError` naming the option.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from s3stream.errors import InvalidArgumentError
from spark_sink.topic import check_topic_name

EARLIEST = -2
"""Per-partition offset spec: the partition's earliest readable offset."""
LATEST = -1
"""Per-partition offset spec: the partition's committed end."""

TASK_BYTES_MAX_DEFAULT = 128 << 20
"""``maxBytesPerTask`` default (Spark's ``spark.sql.files.maxPartitionBytes`` default)."""

OffsetSpec = str | Mapping[int, int]
"""``"earliest"``, ``"latest"``, or partition -> offset (``EARLIEST`` / ``LATEST`` allowed)."""

_KNOWN = {
    "topic",
    "bucketuri",
    "metadataurl",
    "namespace",
    "startingoffsets",
    "endingoffsets",
    "maxrecordspertrigger",
    "maxbytespertrigger",
    "minpartitions",
    "maxbytespertask",
    "path",
}
"""Option names as Spark hands them over (case-insensitive map; compared lower-case)."""


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """The checked options. ``starting`` / ``ending`` are :data:`OffsetSpec` values."""

    topic: str
    metadata_url: str = field(repr=False)
    """May carry a database password: never in a repr (a log line or an error message)."""
    bucket_uri: str | None = field(repr=False)
    """May carry S3 credentials: never in a repr."""
    namespace: str | None
    starting: OffsetSpec
    ending: OffsetSpec
    max_records_per_trigger: int | None
    max_bytes_per_trigger: int | None
    task_bytes_max: int = TASK_BYTES_MAX_DEFAULT
    """``maxBytesPerTask``: a partition's range is cut into tasks of about this many bytes."""
    min_partitions: int | None = None
    """``minPartitions``: cut into smaller tasks so a read makes at least this many where it can."""


def parse_options(options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
    """Check Spark's option map; ``streaming`` refuses ``endingOffsets`` (a stream has no end)."""
    opts = {str(k).lower(): v for k, v in options.items()}
    unknown = sorted(set(opts) - _KNOWN)
    if unknown:
        raise InvalidArgumentError(
            f"s3stream source: unknown option(s) {unknown}; known: topic, bucketUri, metadataUrl, namespace, "
            "startingOffsets, endingOffsets, maxRecordsPerTrigger, maxBytesPerTrigger, minPartitions, "
            "maxBytesPerTask"
        )
    topic = opts.get("topic")
    if not topic:
        raise InvalidArgumentError("s3stream source: option 'topic' is required")
    try:
        check_topic_name(topic)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"s3stream source: option 'topic': {exc}") from exc
    metadata_url = opts.get("metadataurl")
    if not metadata_url:
        raise InvalidArgumentError(
            "s3stream source: option 'metadataUrl' is required (sqlite:///<data dir>/metadata.db or "
            "postgresql://...)"
        )
    bucket_uri = opts.get("bucketuri") or None
    namespace = opts.get("namespace") or None
    default_start = "latest" if streaming else "earliest"
    starting = parse_offset_spec(opts.get("startingoffsets", default_start), topic, option="startingOffsets")
    if streaming and "endingoffsets" in opts:
        raise InvalidArgumentError("s3stream source: 'endingOffsets' is for batch reads (spark.read) only")
    ending = parse_offset_spec(opts.get("endingoffsets", "latest"), topic, option="endingOffsets")
    if ending == "earliest" or (isinstance(ending, Mapping) and EARLIEST in ending.values()):
        raise InvalidArgumentError("s3stream source: 'endingOffsets' cannot be earliest (-2)")
    if isinstance(starting, Mapping) and LATEST in starting.values() and not streaming:
        raise InvalidArgumentError("s3stream source: a batch read's 'startingOffsets' cannot be latest (-1)")
    if starting == "latest" and not streaming:
        raise InvalidArgumentError("s3stream source: a batch read's 'startingOffsets' cannot be latest")
    max_records = _positive(opts.get("maxrecordspertrigger"), "maxRecordsPerTrigger")
    max_bytes = _positive(opts.get("maxbytespertrigger"), "maxBytesPerTrigger")
    if not streaming and (max_records is not None or max_bytes is not None):
        raise InvalidArgumentError("s3stream source: the *PerTrigger options are for streaming reads only")
    return SourceOptions(
        topic=topic,
        metadata_url=metadata_url,
        bucket_uri=bucket_uri,
        namespace=namespace,
        starting=starting,
        ending=ending,
        max_records_per_trigger=max_records,
        max_bytes_per_trigger=max_bytes,
        task_bytes_max=_positive(opts.get("maxbytespertask"), "maxBytesPerTask") or TASK_BYTES_MAX_DEFAULT,
        min_partitions=_positive(opts.get("minpartitions"), "minPartitions"),
    )


def parse_offset_spec(raw: str, topic: str, *, option: str) -> OffsetSpec:
    """``earliest``, ``latest`` or Kafka's JSON ``{"<topic>": {"<partition>": offset}}``."""
    text = raw.strip()
    if text.lower() in ("earliest", "latest"):
        return text.lower()
    try:
        obj = json.loads(text)
    except ValueError as exc:
        raise InvalidArgumentError(
            f"s3stream source: {option} must be earliest, latest or JSON like "
            f'{{"{topic}": {{"0": 5}}}}, got {raw!r}'
        ) from exc
    if not isinstance(obj, dict) or set(obj) != {topic} or not isinstance(obj[topic], dict):
        raise InvalidArgumentError(
            f"s3stream source: {option} JSON must name exactly the topic {topic!r} with an object of "
            f"partition -> offset, got {raw!r}"
        )
    out: dict[int, int] = {}
    for part, offset in obj[topic].items():
        try:
            p = int(part)
        except ValueError:
            p = -1
        if p < 0 or str(p) != str(part):
            raise InvalidArgumentError(f"s3stream source: {option}: partition {part!r} is not an int >= 0")
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < EARLIEST:
            raise InvalidArgumentError(
                f"s3stream source: {option}: partition {p}: offset {offset!r} must be an int >= 0, "
                "-2 (earliest) or -1 (latest)"
            )
        out[p] = offset
    if not out:
        raise InvalidArgumentError(f"s3stream source: {option} names no partition")
    return out


def _positive(raw: str | None, option: str) -> int | None:
    if raw is None:
        return None
    try:
        value = int(str(raw).strip())
    except ValueError:
        value = 0
    if value < 1:
        raise InvalidArgumentError(f"s3stream source: {option} must be an int >= 1, got {raw!r}")
    return value
