"""What the ``s3stream`` source tests share: a topic on Ceph RGW + SQLite/PostgreSQL metadata, its writer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from s3stream.config import Config
from spark_sink.sink import S3StreamSink
from spark_sink.worker_start import WORKER_START_ATTEMPTS, is_worker_start_timeout

PARTITIONS = 3
VALUE_BYTES = 1000
UPLOAD_INTERVAL_MS = 200
"""The writer uploads its WAL blocks this soon, so readers in other processes see them quickly."""


@dataclass(frozen=True)
class TopicEnv:
    """Where a test's topic lives: the writer's data dir, the bucket, the metadata URL."""

    data_dir: Path
    bucket_uri: str
    metadata_url: str
    writer_metadata_url: str | None = None
    """The writer's ``s3.metadata.url`` (None: the data dir's SQLite)."""

    def config(self) -> Config:
        extra: dict[str, Any] = {}
        if self.writer_metadata_url is not None:
            extra["metadata_url"] = self.writer_metadata_url
        return Config.from_sources(env={}, wal_upload_interval_ms=UPLOAD_INTERVAL_MS, **extra)

    def sink(self, query_id: str, **kw: Any) -> S3StreamSink:
        return S3StreamSink(
            self.data_dir,
            bucket_uri=self.bucket_uri,
            config=self.config(),
            topic="t",
            partitions=PARTITIONS,
            stream_column="partition",
            query_id=query_id,
            **kw,
        )

    def options(self) -> dict[str, str]:
        return {"topic": "t", "bucketUri": self.bucket_uri, "metadataUrl": self.metadata_url}


def topic_env(tmp_path: Path, bucket_uri: str, pg_url: str | None = None) -> TopicEnv:
    data_dir = tmp_path / "engine"
    sqlite_url = "sqlite://" + str((data_dir / "metadata.db").resolve())
    return TopicEnv(data_dir, bucket_uri, pg_url or sqlite_url, pg_url)


def rows(spark: Any, first: int, count: int) -> Any:
    """Rows ``first .. first + count - 1``: key ``str(i)``, a ``VALUE_BYTES`` value starting ``i:``,
    partition ``i % PARTITIONS``, timestamp ``1_700_000_000 + i`` s."""
    from pyspark.sql import functions as F

    ids = spark.range(first, first + count, numPartitions=2)
    return ids.select(
        F.col("id").cast("string").alias("key"),
        F.rpad(F.concat(F.col("id").cast("string"), F.lit(":")), VALUE_BYTES, "x").alias("value"),
        (F.col("id") % PARTITIONS).cast("int").alias("partition"),
        F.timestamp_seconds(F.col("id") + 1_700_000_000).alias("timestamp"),
    )


def write_batches(env: TopicEnv, spark: Any, query_id: str, batches: list[tuple[int, int, int]]) -> None:
    """Write micro-batches ``(batch id, first row, row count)`` through the sink, then close it
    (which uploads everything)."""
    with env.sink(query_id) as sink:
        for batch_id, first, count in batches:
            sink(rows(spark, first, count), batch_id)


def keys_of(df: Any) -> list[int]:
    return sorted(int(r[0]) for r in df.selectExpr("cast(key as string)").collect())


def check_offsets(df: Any) -> dict[int, list[int]]:
    """Per partition, the sorted offsets; asserts no offset appears twice."""
    out: dict[int, list[int]] = {}
    for r in df.select("partition", "offset").collect():
        out.setdefault(r[0], []).append(r[1])
    for p, offsets in out.items():
        offsets.sort()
        assert len(offsets) == len(set(offsets)), f"partition {p}: duplicate offsets"
    return out


def await_query(
    start: Callable[[], Any], *, attempts: int = WORKER_START_ATTEMPTS, timeout_s: float = 600
) -> Any:
    """Start a query and wait for it to end (``Trigger.AvailableNow``); restart it from its checkpoint
    when it failed because its Python worker did not start in time. Returns the finished query."""
    from pyspark.errors import StreamingQueryException

    for attempt in range(attempts):
        query = start()
        try:
            assert query.awaitTermination(timeout_s), f"query still running after {timeout_s} s"
            return query
        except StreamingQueryException as exc:
            if not is_worker_start_timeout(exc) or attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")
