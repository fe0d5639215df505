"""The error kinds of s3stream: one root, few kinds, each telling the caller what to do.

Every public operation raises only subclasses of :class:`S3StreamError`. Adapters (S3, filesystem,
SQLite, the WAL) translate their own exceptions at the boundary with ``raise ... from exc``.

| kind                    | what the caller should do                                    |
|-------------------------|--------------------------------------------------------------|
| InvalidArgumentError    | fix the call (bad value, empty/oversized batch, bad config)  |
| AccessDeniedError       | (an InvalidArgumentError) fix the credentials or the policy  |
| NotFoundError           | the stream / object / key does not exist                     |
| OffsetOutOfRangeError   | fetch or trim outside ``[start_offset, confirm_offset]``      |
| FencedError             | another owner holds a newer epoch: stop writing              |
| ClosedError             | the stream / client is closed: reopen                        |
| CapacityError           | WAL or memory full: back off and retry (``retriable``)       |
| UnavailableError        | storage unreachable or timing out (``retriable``)            |
| CorruptionError         | persisted bytes failed validation; carries source + position |
| ConflictError           | a precondition on stored state failed (object exists, ...)   |
| NotOwnerError           | another node owns the stream: go to ``owner_node_id``        |
| MovedError              | the stream moved away while open here: go to the new owner   |
"""

from __future__ import annotations

import enum


class ErrorCode(enum.IntEnum):
    """AutoMQ's controller error codes (Kafka ``Errors``), carried by metadata errors."""

    NONE = 0
    STREAM_EXIST = 501
    STREAM_NOT_EXIST = 502
    STREAM_FENCED = 503
    OBJECT_NOT_EXIST = 504
    STREAM_NOT_OPENED = 505
    STREAM_NOT_CLOSED = 506
    REDUNDANT_OPERATION = 507
    COMPACTED_OBJECTS_NOT_FOUND = 508
    OFFSET_NOT_MATCHED = 509
    NODE_EPOCH_EXPIRED = 510
    NODE_EPOCH_NOT_EXIST = 511
    KEY_EXIST = 512
    KEY_NOT_EXIST = 513
    NODE_FENCED = 514
    NODE_LOCKED = 515
    OBJECT_NOT_COMMITTED = 516
    # -- cluster ownership (ours; AutoMQ's Kafka layer answers NOT_LEADER_OR_FOLLOWER) --
    NOT_OWNER = 517
    STREAM_MOVED = 518
    NODE_NOT_ALIVE = 519
    NODE_TAKEOVER_IN_PROGRESS = 520
    KV_CONDITION_FAILED = 530
    """Ours: a conditional KV write (``kv_expect`` of an external commit) found another value."""
    STREAM_INNER_ERROR = 599


class S3StreamError(Exception):
    """Root of every error s3stream raises."""

    retriable: bool = False

    def __init__(self, message: str, *, code: ErrorCode = ErrorCode.NONE) -> None:
        super().__init__(message)
        self.code = code


class InvalidArgumentError(S3StreamError, ValueError):
    """The call itself is wrong: fix the arguments or the configuration."""


class AccessDeniedError(InvalidArgumentError):
    """The storage refused the credentials or the request (HTTP 403): fix the credentials or the
    bucket policy. A kind of InvalidArgumentError; several buckets count it against a bucket's health
    on writes (credentials revoked on one bucket)."""


class NotFoundError(S3StreamError):
    """The stream, object or key does not exist."""


class OffsetOutOfRangeError(S3StreamError):
    """An offset lies outside the readable range of the stream."""


class FencedError(S3StreamError):
    """Another owner holds a newer epoch (stream epoch or node epoch): stop writing."""


class ClosedError(S3StreamError):
    """The stream or client is closed."""


class ConflictError(S3StreamError):
    """A precondition on stored state failed (conditional create lost, stream not closed, ...)."""


class CapacityError(S3StreamError):
    """The WAL or an in-memory limit is full: back off and retry."""

    retriable = True


class UnavailableError(S3StreamError):
    """Storage is unreachable, throttling or timing out: a transient condition."""

    retriable = True


class CorruptionError(S3StreamError):
    """Persisted bytes failed validation. Never returned as data.

    ``source`` names where the bytes came from (object key, WAL path) and ``position`` the byte
    position of the damaged structure within it, when known.
    """

    def __init__(self, message: str, *, source: str, position: int | None = None) -> None:
        where = source if position is None else f"{source} at byte {position}"
        super().__init__(f"{message} ({where})")
        self.source = source
        self.position = position


class NotOwnerError(S3StreamError):
    """Another node owns the stream (Kafka's NOT_LEADER): send the request to ``owner_node_id``.

    Not retriable on this node; ``owner_node_id`` is -1 when the owner is unknown."""

    def __init__(self, message: str, *, owner_node_id: int, code: ErrorCode = ErrorCode.NOT_OWNER) -> None:
        super().__init__(message, code=code)
        self.owner_node_id = owner_node_id


class MovedError(NotOwnerError):
    """The stream was reassigned away from this node while it was open here; ``owner_node_id`` names
    the new owner."""

    def __init__(self, message: str, *, owner_node_id: int, code: ErrorCode = ErrorCode.STREAM_MOVED) -> None:
        super().__init__(message, owner_node_id=owner_node_id, code=code)
