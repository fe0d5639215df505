"""s3stream: a stream storage engine on object storage, in the design of AutoMQ's S3Stream."""

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
from s3stream.model import FetchedBatch, RecordBatch

__all__ = [
    "CapacityError",
    "ClosedError",
    "ConflictError",
    "CorruptionError",
    "FencedError",
    "FetchedBatch",
    "InvalidArgumentError",
    "NotFoundError",
    "OffsetOutOfRangeError",
    "RecordBatch",
    "S3StreamError",
    "UnavailableError",
]
__version__ = "0.1.0"
