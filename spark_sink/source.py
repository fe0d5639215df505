"""``S3StreamDataSource``: a topic written by the sink, read by Spark as a stream or a batch (``s3stream``).

``spark.dataSource.register(S3StreamDataSource)``, then ``spark.readStream.format("s3stream")`` or
``spark.read.format("s3stream")`` with the options of ``docs/spark-sink.md`` section "Streaming
source". Built on PySpark's Python Data Source API (PySpark >= 4.2: ``latestOffset(start, limit)``).

Division of work: the driver reads metadata only (the topic, its committed record, the streams'
uploaded ends, object sizes for ``maxBytesPerTrigger``) and plans offset ranges
(:mod:`spark_sink.source_plan`); executor tasks fetch those ranges from the objects and decode them
(:mod:`spark_sink.source_read`). Nothing here writes anything.

Exactly once downstream of the source: a micro-batch's offsets are checkpointed by Spark before it
runs, and ``partitions(start, end)`` plans the same records for the same offsets whenever it is
called (the committed records below an end never change; ``spark_sink abandon`` only discards
offsets above the committed ends of its time), so a restart from the checkpoint replays exactly the
records of the unfinished micro-batch and continues after the last committed one.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from s3stream.errors import InvalidArgumentError
from s3stream.remote import SyncReader
from spark_sink.source_options import SourceOptions, parse_options
from spark_sink.source_plan import (
    ReadRange,
    TopicSnapshot,
    cap_bytes,
    cap_records,
    offsets_from_json,
    offsets_to_json,
    plan_ranges,
    resolve_offsets,
)
from spark_sink.source_read import SOURCE_DDL, SOURCE_SCHEMA, read_ranges
from spark_sink.source_split import ObjectSpan, share_object_sizes, split_tasks
from spark_sink.source_state import object_sizes, object_spans, open_source_reader, reader_key, topic_snapshot

SOURCE_NAME = "s3stream"


@dataclass(frozen=True, slots=True)
class _Task:
    """One executor task's ranges (pickled to the executor)."""

    ranges: tuple[ReadRange, ...]


class S3StreamPartition(InputPartition):
    """An input partition: ranges of one topic partition, all of them or a part cut at object
    boundaries (or none, for an empty read)."""

    def __init__(self, ranges: Sequence[ReadRange]) -> None:
        super().__init__(_Task(tuple(ranges)))
        self.ranges = tuple(ranges)


def _tasks(
    reader: SyncReader, snap: TopicSnapshot, ranges: Sequence[ReadRange], opts: SourceOptions
) -> list[S3StreamPartition]:
    """The executor tasks of ``ranges``: one per topic partition with something to read, cut at
    object boundaries into tasks of about ``maxBytesPerTask`` (or fewer bytes, for
    ``minPartitions``) by the objects' sizes (:mod:`spark_sink.source_split`)."""
    spans: dict[int, list[ObjectSpan]] = {}
    for p in sorted({r.partition for r in ranges}):
        lo = min(r.start_offset for r in ranges if r.partition == p)
        hi = max(r.end_offset for r in ranges if r.partition == p)
        spans[p] = object_spans(reader, snap, lo, hi, p)
    tasks = split_tasks(
        ranges,
        share_object_sizes(spans),
        task_bytes_max=opts.task_bytes_max,
        min_tasks=opts.min_partitions,
    )
    return [S3StreamPartition(t) for t in tasks]


class S3StreamDataSource(DataSource):
    """The ``s3stream`` source: ``spark.dataSource.register(S3StreamDataSource)``."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return SOURCE_DDL

    def reader(self, schema: Any) -> DataSourceReader:
        _check_schema(schema)
        return S3StreamBatchReader(parse_options(self.options, streaming=False))

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        _check_schema(schema)
        return S3StreamStreamReader(parse_options(self.options, streaming=True))


def _check_schema(schema: Any) -> None:
    names = list(getattr(schema, "names", SOURCE_SCHEMA.names))
    if names != SOURCE_SCHEMA.names:
        raise InvalidArgumentError(
            f"s3stream source: the schema is fixed ({SOURCE_DDL}); do not pass another, got columns {names}"
        )


class _DriverSide:
    """The driver's reader, opened at first use and never pickled to executors."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._reader: SyncReader | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"opts": self.opts}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.opts = state["opts"]
        self._reader = None

    def snapshot(self) -> TopicSnapshot:
        return topic_snapshot(self.reader(), self.opts.topic)

    def reader(self) -> SyncReader:
        if self._reader is None:
            self._reader = open_source_reader(reader_key(self.opts))
        return self._reader

    def close(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.close()


class S3StreamStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch reader: offsets are Kafka's JSON ``{"<topic>": {"<partition>": offset}}``."""

    def __init__(self, opts: SourceOptions) -> None:
        self._driver = _DriverSide(opts)
        self._opts = opts
        self._target: tuple[int, ...] | None = None
        """The readable ends when ``Trigger.AvailableNow`` began; latestOffset stays below them."""

    def initialOffset(self) -> dict[str, Any]:
        snap = self._driver.snapshot()
        return offsets_to_json(
            snap.topic, resolve_offsets(self._opts.starting, snap, option="startingOffsets")
        )

    def getDefaultReadLimit(self) -> ReadLimit:
        if self._opts.max_records_per_trigger is not None:
            return ReadMaxRows(self._opts.max_records_per_trigger)
        if self._opts.max_bytes_per_trigger is not None:
            return ReadMaxBytes(self._opts.max_bytes_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._driver.snapshot().readable_ends

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        snap = self._driver.snapshot()
        begin = offsets_from_json(start, snap.topic, snap.partition_count)
        avail = snap.readable_ends
        if self._target is not None:
            avail = tuple(min(a, t) for a, t in zip(avail, self._target, strict=True))
        ends = tuple(max(b, a) for b, a in zip(begin, avail, strict=True))
        if not isinstance(limit, ReadAllAvailable):
            max_records = self._opts.max_records_per_trigger
            max_bytes = self._opts.max_bytes_per_trigger
            if isinstance(limit, ReadMaxRows):
                max_records = limit.max_rows if max_records is None else min(max_records, limit.max_rows)
            if isinstance(limit, ReadMaxBytes):
                max_bytes = limit.max_bytes if max_bytes is None else min(max_bytes, limit.max_bytes)
            if max_records is not None:
                ends = cap_records(begin, ends, max_records)
            if max_bytes is not None:
                reader = self._driver.reader()
                sizes = [
                    object_sizes(reader, snap, begin[p], ends[p], p) for p in range(snap.partition_count)
                ]
                ends = cap_bytes(begin, ends, sizes, max_bytes)
        return offsets_to_json(snap.topic, ends)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        snap = self._driver.snapshot()
        return offsets_to_json(snap.topic, snap.readable_ends)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        snap = self._driver.snapshot()
        begin = offsets_from_json(start, snap.topic, snap.partition_count)
        finish = offsets_from_json(end, snap.topic, snap.partition_count)
        return _tasks(self._driver.reader(), snap, plan_ranges(snap, begin, finish), self._opts)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, S3StreamPartition)
        return read_ranges(reader_key(self._opts), self._opts.topic, partition.ranges)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: the topic's data is kept by the writer's retention, not by readers."""

    def stop(self) -> None:
        self._driver.close()


class S3StreamBatchReader(DataSourceReader):
    """Batch read of ``[startingOffsets, endingOffsets)`` (default: everything committed)."""

    def __init__(self, opts: SourceOptions) -> None:
        self._opts = opts

    def partitions(self) -> Sequence[InputPartition]:
        driver = _DriverSide(self._opts)
        try:
            return self._partitions(driver)
        finally:
            driver.close()

    def _partitions(self, driver: _DriverSide) -> Sequence[InputPartition]:
        snap = driver.snapshot()
        begin = resolve_offsets(self._opts.starting, snap, option="startingOffsets")
        finish = resolve_offsets(self._opts.ending, snap, option="endingOffsets")
        for p, (b, f) in enumerate(zip(begin, finish, strict=True)):
            if b > f:
                raise InvalidArgumentError(
                    f"s3stream source: partition {p}: startingOffsets {b} is above endingOffsets {f}"
                )
        tasks = _tasks(driver.reader(), snap, plan_ranges(snap, begin, finish), self._opts)
        return tasks or [S3StreamPartition(())]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, S3StreamPartition)
        return read_ranges(reader_key(self._opts), self._opts.topic, partition.ranges)
