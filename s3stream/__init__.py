"""s3stream: a stream storage engine on object storage, in the design of AutoMQ's S3Stream.

``await s3stream.open(data_dir, bucket_uri=None, config=None)`` opens the embedded engine;
``await s3stream.open_reader(bucket_uri=..., metadata_url=..., config=...)`` a reader of the uploaded
data of every stream, in any process (:mod:`s3stream.remote`); an
application calls ``s3stream.freeze_startup_heap()`` once its start-up is over. The object storage a
data dir records is read by :func:`s3stream.binding.read_recorded_storage`.
"""

from typing import TYPE_CHECKING, Any

from s3stream.config import Config
from s3stream.engine.client import Client, KVClient, Stream, StreamClient
from s3stream.errors import (
    CapacityError,
    ClosedError,
    ConflictError,
    CorruptionError,
    FencedError,
    InvalidArgumentError,
    NotFoundError,
    OffsetOutOfRangeError,
    S3StreamError,
    UnavailableError,
)
from s3stream.facade import SyncClient, SyncKVClient, SyncStream, SyncStreamClient
from s3stream.heap import freeze_startup_heap
from s3stream.ids import StreamId
from s3stream.model import FetchedBatch, RecordBatch
from s3stream.remote import Reader, SyncReader

if TYPE_CHECKING:
    from s3stream.assembly import open_client as open
    from s3stream.assembly import open_reader, open_reader_sync, open_sync


def __getattr__(name: str) -> Any:
    """``s3stream.open`` / ``open_sync`` / ``open_reader`` / ``open_reader_sync`` come from the assembly, imported on first use.

    The assembly wires the compactor, which imports s3stream's lower layers; importing it here eagerly
    would make ``import compaction...`` (or any ``s3stream.<module>`` first) circular.
    """
    if name in ("open", "open_sync", "open_reader", "open_reader_sync"):
        from s3stream import assembly

        return assembly.open_client if name == "open" else getattr(assembly, name)
    raise AttributeError(f"module 's3stream' has no attribute {name!r}")


__all__ = [
    "CapacityError",
    "Client",
    "ClosedError",
    "Config",
    "ConflictError",
    "CorruptionError",
    "FencedError",
    "FetchedBatch",
    "InvalidArgumentError",
    "KVClient",
    "NotFoundError",
    "OffsetOutOfRangeError",
    "Reader",
    "RecordBatch",
    "S3StreamError",
    "Stream",
    "StreamClient",
    "StreamId",
    "SyncClient",
    "SyncKVClient",
    "SyncReader",
    "SyncStream",
    "SyncStreamClient",
    "UnavailableError",
    "freeze_startup_heap",
    "open",
    "open_reader",
    "open_reader_sync",
    "open_sync",
]
__version__ = "0.1.0"
