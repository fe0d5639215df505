"""The foreachBatch sink: Spark micro-batches into s3stream streams, exactly once.

    sink = S3StreamSink("/data/s3stream", topic="events", partitions=4)
    query = (df.writeStream.foreachBatch(sink)
             .option("checkpointLocation", "/data/ckpt").start())

Per micro-batch (all on the driver except step 2):

1. check the schema and normalize the columns (:func:`~spark_sink.columns.normalize`; errors name the
   column and batch);
2. encode on the executors with ``mapInArrow`` into Kafka RecordBatch payloads per target partition
   (:mod:`spark_sink.encode`) and collect them as one Arrow table (no row-by-row Python here);
3. order the payloads deterministically, cut them into chunks below the WAL record limit
   (:func:`~spark_sink.protocol.chunk_payloads`) and plan the replay
   (:func:`~spark_sink.protocol.plan_batch`) from the progress record in the engine's KV;
4. check that every partition ends where the protocol says (committed end plus this batch's
   committed chunks), then append each remaining chunk with a conditional ``append_atomic`` (each
   batch at the offset written into its Kafka header, else nothing of the chunk), the progress record
   in the same WAL record, with chunk 0 of a multi-chunk batch the topic's writer record, and with
   the last chunk the topic's committed end offsets (read-committed visibility:
   :mod:`spark_sink.reader` stops there).

The engine is opened once per sink (lazily, in the driver) and kept until :meth:`S3StreamSink.close`.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

from s3stream.assembly import open_sync
from s3stream.config import Config
from s3stream.errors import ConflictError, InvalidArgumentError
from s3stream.facade import SyncClient, SyncStream
from s3stream.model import RecordBatch
from spark_sink import kafka_codec
from spark_sink.columns import ColumnCache, normalize
from spark_sink.direct import (
    PERSIST_LEVEL_DEFAULT,
    PERSIST_LEVELS,
    DirectStats,
    DirectWriter,
    direct_batch_committed,
    direct_target,
    read_committed_record,
)
from spark_sink.direct_tasks import TaskObserver
from spark_sink.encode import (
    OUTPUT_DDL,
    EncodeOptions,
    map_in_arrow,
)
from spark_sink.payloads import PayloadTable
from spark_sink.protocol import (
    KV_OVERHEAD_BYTES,
    QUERY_ID_MAX_BYTES,
    Committed,
    Writer,
    chunk_payloads,
    committed_after,
    committed_key,
    committed_max_bytes,
    discarded_max_bytes,
    expected_next_offsets,
    load_progress,
    plan_batch,
    progress_after,
    progress_key,
    writer_key,
)
from spark_sink.topic import PARTITION_MAX_COUNT, Topic, ensure_topic, open_partitions

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

ProgressObserver = Callable[[str], None]
"""Called after each durable step of a micro-batch with the step's name: ``after_chunk:<batch>:<chunk>``
once the chunk's ``append_atomic`` returned, ``after_batch:<batch>`` once the whole batch is written."""

BATCH_BYTES_TARGET_DEFAULT = 1 << 20
RECORD_MAX_BYTES_DEFAULT = 1 << 20
HISTORY_MAX = 1000
_SPILL_NAME = re.compile(r"b\d+-[0-9a-f]{12}")
RECORD_OVERHEAD_MAX_BYTES = 1024
"""Room a batch keeps above its target for the record that crosses it (varints, header)."""


@dataclass(frozen=True, slots=True)
class BatchStats:
    """What one call of the sink did (for logs, tests and benchmarks)."""

    batch_id: int
    rows: int
    payloads: int
    chunks: int
    chunks_written: int
    bytes_written: int
    encode_s: float
    """Spark job: executor encoding and the collection of the payloads."""
    prepare_s: float
    """Driver: payload buffer, ordering, chunking, progress read."""
    append_s: float
    """Engine appends (``append_atomic`` per chunk)."""


def _no_progress_observer(step: str) -> None:
    """The default :data:`ProgressObserver`: does nothing."""


class S3StreamSink:
    """A ``foreachBatch`` function writing each micro-batch into a topic of s3stream, exactly once.

    ``data_dir``/``bucket_uri``/``config`` open the engine (see ``s3stream.open``); or pass an open
    ``client`` (the sink then does not close it). ``stream_column`` names an integer column giving the
    partition of each row in ``[0, partitions)``; without it rows are routed by key hash.
    ``progress_observer`` is called with the name of each durable step (see :data:`ProgressObserver`).
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str] | None = None,
        *,
        bucket_uri: str | None = None,
        config: Config | None = None,
        client: SyncClient | None = None,
        topic: str = "spark",
        partitions: int = 1,
        stream_column: str | None = None,
        batch_bytes_target: int = BATCH_BYTES_TARGET_DEFAULT,
        record_max_bytes: int = RECORD_MAX_BYTES_DEFAULT,
        chunk_max_bytes: int | None = None,
        query_id: str | None = None,
        spill: bool | None = None,
        spill_dir: str | os.PathLike[str] | None = None,
        progress_observer: ProgressObserver = _no_progress_observer,
        direct: bool | None = None,
        task_observer: TaskObserver | None = None,
        persist_level: str = PERSIST_LEVEL_DEFAULT,
    ) -> None:
        if (data_dir is None) == (client is None):
            raise InvalidArgumentError("give exactly one of data_dir and client")
        self._data_dir = data_dir
        self._bucket_uri = bucket_uri
        self._config = config if config is not None else Config()
        self._client = client
        self._owns_client = client is None
        self.topic_name = topic
        if isinstance(partitions, bool) or not isinstance(partitions, int):
            raise InvalidArgumentError(f"partitions must be an int, got {partitions!r}")
        if not 1 <= partitions <= PARTITION_MAX_COUNT:
            raise InvalidArgumentError(f"partitions must be in [1, {PARTITION_MAX_COUNT}], got {partitions}")
        self.partition_count = partitions
        self.stream_column = stream_column
        self.batch_bytes_target = batch_bytes_target
        self.record_max_bytes = record_max_bytes
        wal_max = self._config.wal_record_max_bytes
        self.chunk_max_bytes = wal_max if chunk_max_bytes is None else chunk_max_bytes
        self._query_id = query_id
        self._progress_observer = progress_observer
        self.spill = spill
        """True: executors hand payloads over in files (same machine only); None: in local mode."""
        if spill_dir is not None:
            self._spill_root = Path(spill_dir)
        elif data_dir is not None:
            self._spill_root = Path(data_dir) / "spark-spill"
        else:
            self._spill_root = Path(tempfile.gettempdir()) / f"s3stream-spark-spill-{os.getpid()}"
        self._spill_cleaned = False
        self._check_limits()
        self._topic: Topic | None = None
        self._streams: list[SyncStream] = []
        self._lock = threading.Lock()
        self._columns: ColumnCache = {}
        self._kv_max_bytes = KV_OVERHEAD_BYTES + committed_max_bytes(partitions)
        self.history: deque[BatchStats] = deque(maxlen=HISTORY_MAX)
        """What the last micro-batches did, newest last."""
        self.direct = direct
        """True: executors write objects, the driver commits them (:mod:`spark_sink.direct`); False:
        the driver appends through its WAL; None: direct when the topic's objects are on S3."""
        self._task_observer = task_observer
        if persist_level not in PERSIST_LEVELS:
            raise InvalidArgumentError(
                f"persist_level must be one of {PERSIST_LEVELS}, got {persist_level!r}"
            )
        self.persist_level = persist_level
        """The ``StorageLevel`` the direct path keeps a micro-batch in between its two passes
        (``DISK_ONLY`` keeps executor heap free, e.g. in local mode where executors share the driver's JVM)."""
        self._direct_writer: DirectWriter | None = None
        self._direct_resolved = False
        self.direct_history: deque[DirectStats] = deque(maxlen=HISTORY_MAX)
        """What the last direct micro-batches did, newest last."""

    def _check_limits(self) -> None:
        payload_max = self.batch_bytes_target + self.record_max_bytes + RECORD_OVERHEAD_MAX_BYTES
        if min(self.batch_bytes_target, self.record_max_bytes) < 1:
            raise InvalidArgumentError("batch_bytes_target and record_max_bytes must be positive")
        if payload_max > self._config.record_max_bytes:
            raise InvalidArgumentError(
                f"batch_bytes_target + record_max_bytes ({payload_max} with overhead) must fit "
                f"s3.record.size.max ({self._config.record_max_bytes})"
            )
        kv_max_bytes = KV_OVERHEAD_BYTES + committed_max_bytes(self.partition_count)
        if payload_max + kv_max_bytes + 1024 > self.chunk_max_bytes:
            raise InvalidArgumentError(f"chunk_max_bytes {self.chunk_max_bytes} is too small for one payload")
        if self.chunk_max_bytes > self._config.wal_record_max_bytes:
            raise InvalidArgumentError(
                f"chunk_max_bytes {self.chunk_max_bytes} is above s3.wal.record.size.max "
                f"({self._config.wal_record_max_bytes})"
            )

    # -- engine ----------------------------------------------------------------------------------
    @property
    def client(self) -> SyncClient:
        """The engine client, opened on first use."""
        if self._client is None:
            assert self._data_dir is not None
            self._client = open_sync(self._data_dir, bucket_uri=self._bucket_uri, config=self._config)
        return self._client

    def _ensure_streams(self) -> list[SyncStream]:
        if not self._streams:
            self._topic = ensure_topic(self.client, self.topic_name, self.partition_count)
            self._streams = open_partitions(self.client, self._topic)
        return self._streams

    def _committed(self) -> Committed:
        """The topic's committed end offsets (nothing committed if no micro-batch completed yet)."""
        return read_committed_record(self.client, self.topic_name, self.partition_count)

    def _chunk_kv_max_bytes(self, committed: Committed) -> int:
        """Bytes each chunk keeps for its KV records, the committed record's discarded ranges included.

        The ranges change only by ``spark_sink abandon``, which also refuses the replay of the batch
        it abandons: a partly written micro-batch is always re-cut with the same budget.
        """
        kv_max_bytes = self._kv_max_bytes + discarded_max_bytes(len(committed.discarded))
        payload_max = self.batch_bytes_target + self.record_max_bytes + RECORD_OVERHEAD_MAX_BYTES
        if payload_max + kv_max_bytes + 1024 > self.chunk_max_bytes:
            raise InvalidArgumentError(
                f"chunk_max_bytes {self.chunk_max_bytes} is too small for one payload next to the "
                f"committed record of topic {self.topic_name!r} ({len(committed.discarded)} discarded ranges)"
            )
        return kv_max_bytes

    def _check_next_offsets(self, streams: list[SyncStream], expected: list[int], batch_id: int) -> None:
        """Before anything is written: every stream ends where the protocol says, else ConflictError.

        A stream holding more records than the committed ends plus this micro-batch's committed
        chunks was written outside this protocol: another writer, or an interrupted micro-batch of
        another query (its chunks are past the committed ends; appending after them would make them
        visible).
        """
        for p, (stream, want) in enumerate(zip(streams, expected, strict=True)):
            got = stream.next_offset
            if got != want:
                raise ConflictError(
                    f"micro-batch {batch_id}: partition {p} of topic {self.topic_name!r} ends at offset "
                    f"{got}, the sink expected {want} (committed end plus this batch's committed "
                    "chunks): another writer appended to the topic, or another query left a micro-batch "
                    "unfinished; nothing of this micro-batch was written"
                )

    def _refused_chunk(self, batch_id: int, index: int, exc: ConflictError) -> ConflictError:
        """The engine refused a chunk (a stream no longer ends where the sink predicted): what that left."""
        if index == 0:
            left = (
                "nothing of this micro-batch was written; the foreign records lie past the committed "
                "ends (invisible), and the offset check refuses every micro-batch until "
                "`python -m spark_sink abandon` discards them"
            )
        else:
            left = (
                f"chunks 0-{index - 1} of this micro-batch are in the streams, past the committed ends "
                "(invisible), before the foreign records: its replay fails the offset check; "
                "`python -m spark_sink abandon` discards both"
            )
        return ConflictError(
            f"micro-batch {batch_id}: chunk {index} was refused ({exc}): something appended to topic "
            f"{self.topic_name!r} through this sink's client during the call; nothing of the chunk "
            f"was written and nothing foreign became visible; {left}"
        )

    def close(self) -> None:
        """Close the streams (forcing their data up) and, if the sink opened it, the engine."""
        with self._lock:
            streams, self._streams = self._streams, []
            try:
                for s in streams:
                    s.close()
            finally:
                if self._owns_client and self._client is not None:
                    client, self._client = self._client, None
                    client.close()

    def __enter__(self) -> S3StreamSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- foreachBatch ----------------------------------------------------------------------------
    def __call__(self, df: DataFrame, batch_id: int) -> None:
        with self._lock:
            try:
                stats = self._write_batch(df, batch_id)
            except BaseException:
                self._meter_batch(None)
                raise
            self.history.append(stats)
            self._meter_batch(stats)

    def _meter_batch(self, stats: BatchStats | None) -> None:
        """Report the micro-batch to the client's metrics (``s3stream_spark_*``; a no-op when off):
        ``skipped`` when it wrote nothing (a replay of a committed batch, or an empty one)."""
        engine_client = getattr(self._client, "client", None)  # None: the client never opened
        metrics = getattr(engine_client, "metrics", None)
        if metrics is None:
            return
        path = "direct" if self._direct_writer is not None else "driver"
        if stats is None:
            metrics.spark_batch(path=path, outcome="error", rows=0, commit_s=None)
        elif stats.chunks_written == 0:
            metrics.spark_batch(path=path, outcome="skipped", rows=0, commit_s=None)
        else:
            metrics.spark_batch(path=path, outcome="committed", rows=stats.rows, commit_s=stats.append_s)

    def _query_id_of(self, df: DataFrame) -> str:
        if self._query_id is not None:
            return self._query_id
        qid = df.sparkSession.sparkContext.getLocalProperty("sql.streaming.queryId")
        if not qid:
            raise InvalidArgumentError(
                "the sink runs outside a streaming query (no sql.streaming.queryId): pass query_id="
            )
        return str(qid)

    def _write_batch(self, df: DataFrame, batch_id: int) -> BatchStats:
        query_id = self._query_id_of(df)
        t0 = time.perf_counter()
        writer = self._direct()
        if writer is not None:
            return self._write_direct(writer, df, batch_id, query_id)
        if direct_batch_committed(self.client, query_id, self.topic_name, batch_id):
            # committed on the direct path (the sink was switched): a replay writes nothing
            self._progress_observer(f"after_batch:{batch_id}")
            return BatchStats(batch_id, 0, 0, 0, 0, 0, 0.0, 0.0, 0.0)
        spill_dir = self._spill_dir_for(df, batch_id)
        try:
            return self._write_encoded(df, batch_id, query_id, spill_dir, t0)
        finally:
            if spill_dir is not None:
                shutil.rmtree(spill_dir, ignore_errors=True)

    # -- direct path -----------------------------------------------------------------------------
    def _direct(self) -> DirectWriter | None:
        """The direct-path writer when this call uses the direct path (:attr:`direct`, read per call;
        where the executors write is decided on first use)."""
        if self.direct is False:
            return None
        if not self._direct_resolved:
            target = direct_target(self.client, self._bucket_uri, self.direct)
            if target is not None:
                self._direct_writer = DirectWriter(
                    client=self.client,
                    topic=self.topic_name,
                    streams=self._ensure_streams(),
                    bucket_uri=target,
                    namespace=self._config.namespace,
                    prepared_ttl_ms=self._config.direct_prepared_ttl_ms,
                    observer=self._progress_observer,
                    task_observer=self._task_observer,
                    persist_level=self.persist_level,
                )
            self._direct_resolved = True
        return self._direct_writer

    def _write_direct(self, writer: DirectWriter, df: DataFrame, batch_id: int, query_id: str) -> BatchStats:
        if len(query_id.encode()) > QUERY_ID_MAX_BYTES:
            raise InvalidArgumentError(
                f"query id {query_id[:40]!r}... is longer than {QUERY_ID_MAX_BYTES} bytes (UTF-8)"
            )
        options = EncodeOptions(
            batch_id=batch_id,
            partition_count=self.partition_count,
            batch_bytes_target=self.batch_bytes_target,
            record_max_bytes=self.record_max_bytes,
            partition_column=self.stream_column or "key hash",
        )
        rows = normalize(
            df,
            batch_id=batch_id,
            stream_column=self.stream_column,
            partition_count=self.partition_count,
            cache=self._columns,
        )
        stats = writer.write(rows, options, query_id=query_id)
        self.direct_history.append(stats)
        return BatchStats(
            batch_id=batch_id,
            rows=stats.rows,
            payloads=stats.objects,
            chunks=0 if stats.skipped else 1,
            chunks_written=0 if stats.skipped else 1,
            bytes_written=stats.bytes_written,
            encode_s=stats.count_s + stats.write_s,
            prepare_s=0.0,
            append_s=stats.commit_s,
        )

    def _spill_dir_for(self, df: DataFrame, batch_id: int) -> Path | None:
        """A fresh directory for the executors' payload files, or None to return payloads inline."""
        spill = self.spill
        if spill is None:
            spill = str(df.sparkSession.sparkContext.master).startswith("local")
        if not spill:
            return None
        if not self._spill_cleaned:
            # directories of a crashed earlier run: only ours (b<batch id>-<12 hex>), never the root
            if self._spill_root.is_dir():
                for entry in self._spill_root.iterdir():
                    if _SPILL_NAME.fullmatch(entry.name) and entry.is_dir():
                        shutil.rmtree(entry, ignore_errors=True)
            self._spill_cleaned = True
        path = self._spill_root / f"b{batch_id}-{uuid.uuid4().hex[:12]}"
        path.mkdir(parents=True)
        return path

    def _write_encoded(
        self, df: DataFrame, batch_id: int, query_id: str, spill_dir: Path | None, t0: float
    ) -> BatchStats:
        options = EncodeOptions(
            batch_id=batch_id,
            partition_count=self.partition_count,
            batch_bytes_target=self.batch_bytes_target,
            record_max_bytes=self.record_max_bytes,
            partition_column=self.stream_column or "key hash",
            spill_dir=None if spill_dir is None else str(spill_dir),
        )
        rows = normalize(
            df,
            batch_id=batch_id,
            stream_column=self.stream_column,
            partition_count=self.partition_count,
            cache=self._columns,
        )
        table = rows.mapInArrow(map_in_arrow(options), OUTPUT_DDL).toArrow()
        encode_s = time.perf_counter() - t0
        errors = table.column("error").drop_null()
        if len(errors):
            raise InvalidArgumentError(str(errors[0]))
        payloads = PayloadTable(table)
        try:
            return self._append_payloads(batch_id, query_id, payloads, t0, encode_s)
        finally:
            payloads.close()

    def _append_payloads(
        self, batch_id: int, query_id: str, payloads: PayloadTable, t0: float, encode_s: float
    ) -> BatchStats:
        if len(query_id.encode()) > QUERY_ID_MAX_BYTES:
            raise InvalidArgumentError(
                f"query id {query_id[:40]!r}... is longer than {QUERY_ID_MAX_BYTES} bytes (UTF-8)"
            )
        refs = payloads.refs()
        streams = self._ensure_streams()
        committed = self._committed()
        chunks = chunk_payloads(refs, self.chunk_max_bytes, kv_max_bytes=self._chunk_kv_max_bytes(committed))
        key = progress_key(query_id, self.topic_name)
        progress = load_progress(self.client.kv.get, query_id, self.topic_name, committed)
        plan = plan_batch(progress, batch_id, chunks)
        next_offsets = expected_next_offsets(committed, chunks, plan)
        self._check_next_offsets(streams, next_offsets, batch_id)
        t1 = time.perf_counter()
        written = 0
        for index in range(plan.first_chunk, plan.chunk_count):
            chunk = chunks[index]
            appends: list[tuple[SyncStream, RecordBatch, int]] = []
            for ref in chunk.payloads:
                payload = payloads.view(ref.index)
                base = next_offsets[ref.partition]
                kafka_codec.set_base_offset(payload, 0, base)
                next_offsets[ref.partition] = base + ref.record_count
                # RecordBatch accepts a memoryview (it checks bytes | bytearray | memoryview); the
                # engine copies it, so the collected buffer is not copied a second time here.
                batch = RecordBatch(cast(bytes, payload), ref.record_count)
                # conditional: the engine appends the chunk only at the offsets written into it
                appends.append((streams[ref.partition], batch, base))
                written += len(payload)
            kv = {key: progress_after(plan, chunks, index).encode()}
            if index == 0 and plan.chunk_count > 1:
                kv[writer_key(self.topic_name)] = Writer(query_id, batch_id).encode()
            if index == plan.chunk_count - 1:
                kv[committed_key(self.topic_name)] = committed_after(
                    committed, chunks, plan, query_id=query_id
                ).encode()
            try:
                bases = self.client.append_atomic(appends, kv=kv)
            except ConflictError as exc:
                raise self._refused_chunk(batch_id, index, exc) from exc
            assert bases == [a[2] for a in appends], "a conditional chunk is appended where expected only"
            self._progress_observer(f"after_chunk:{batch_id}:{index}")
        self._progress_observer(f"after_batch:{batch_id}")
        return BatchStats(
            batch_id=batch_id,
            rows=sum(r.record_count for r in refs),
            payloads=len(refs),
            chunks=len(chunks),
            chunks_written=plan.chunk_count - plan.first_chunk,
            bytes_written=written,
            encode_s=encode_s,
            prepare_s=t1 - t0 - encode_s,
            append_s=time.perf_counter() - t1,
        )
