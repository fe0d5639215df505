"""s3stream: a stream storage engine on object storage, in the design of AutoMQ's S3Stream."""

from s3stream.assembly import open_client, open_sync
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
from s3stream.ids import StreamId
from s3stream.model import FetchedBatch, RecordBatch

open = open_client
"""``await s3stream.open(data_dir, bucket_uri=None, config=None)``: the embedded engine (see the assembly)."""

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
    "RecordBatch",
    "S3StreamError",
    "Stream",
    "StreamClient",
    "StreamId",
    "SyncClient",
    "SyncKVClient",
    "SyncStream",
    "SyncStreamClient",
    "UnavailableError",
    "open",
    "open_sync",
]
__version__ = "0.1.0"
