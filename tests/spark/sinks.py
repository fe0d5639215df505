"""The small-chunk sink the offset and abandon tests share: chunk boundaries fall inside batches."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from s3stream.facade import SyncStream
from s3stream.model import RecordBatch
from spark_sink.sink import S3StreamSink

ROWS = 400
"""Rows per micro-batch the tests write."""

Appends = Sequence[tuple[SyncStream, RecordBatch] | tuple[SyncStream, RecordBatch, int | None]]
"""What ``append_atomic`` is given: (stream, batch) or (stream, batch, expected base offset)."""


def small_chunk_sink(data_dir: Path, query_id: str) -> S3StreamSink:
    """400 rows of ~300 bytes in 2 partitions, Kafka batches cut at 8 KiB, chunks of 20 kB: 7-8 chunks."""
    return S3StreamSink(
        data_dir,
        topic="t",
        partitions=2,
        stream_column="p",
        query_id=query_id,
        batch_bytes_target=8192,
        record_max_bytes=4096,
        chunk_max_bytes=20_000,
    )
