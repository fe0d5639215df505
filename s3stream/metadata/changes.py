"""The changes a metadata operation writes: AutoMQ's metadata records, as frozen values.

The controller (:mod:`s3stream.metadata.controller`) decides an operation against a read-only view
of the state and returns a list of these; a backend applies the whole list in one transaction or
not at all. Every change is an upsert or a removal, so applying the same list twice is harmless.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from s3stream.ids import NodeId, ObjectId, StreamId
from s3stream.metadata.base import (
    Assignment,
    LeaseInfo,
    NodeRuntime,
    RangeMetadata,
    S3ObjectMetadata,
    StreamObject,
    StreamSetObject,
    StreamState,
    TakeoverInfo,
)


class Counter(enum.Enum):
    """The id counters; each stores the next id to hand out (AutoMQ stores the last one)."""

    STREAM_ID = "next_stream_id"
    OBJECT_ID = "next_object_id"


@dataclass(frozen=True, slots=True)
class SetCounter:
    counter: Counter
    next_value: int


@dataclass(frozen=True, slots=True)
class PutNode:
    """The node's whole row: its current epoch and lease (``-1``: none / never)."""

    node_id: NodeId
    node_epoch: int
    lease_expires_at_ms: int = -1
    heartbeat_at_ms: int = -1
    registered_at_ms: int = -1


@dataclass(frozen=True, slots=True)
class PutLease:
    lease: LeaseInfo


@dataclass(frozen=True, slots=True)
class RemoveLease:
    name: str


@dataclass(frozen=True, slots=True)
class PutStream:
    """The stream's own fields; its ranges are separate changes."""

    stream_id: StreamId
    epoch: int
    state: StreamState
    start_offset: int
    end_offset: int
    tags: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class RemoveStream:
    """Forget a stream with its ranges and its stream-object index (the objects stay)."""

    stream_id: StreamId


@dataclass(frozen=True, slots=True)
class PutRange:
    range: RangeMetadata


@dataclass(frozen=True, slots=True)
class AdvanceEndOffsets:
    """Set each stream's end offset and the end offset of its last range (the highest index; both
    exist): the advance of a WAL upload's commit, which touches no other field (no stream or range
    row rebuilt). Columns, one change for every stream of the commit (no object per stream)."""

    stream_ids: tuple[StreamId, ...]
    end_offsets: tuple[int, ...]

    def __post_init__(self) -> None:
        assert len(self.stream_ids) == len(self.end_offsets)


@dataclass(frozen=True, slots=True)
class RemoveRange:
    stream_id: StreamId
    range_index: int


@dataclass(frozen=True, slots=True)
class PutObject:
    object: S3ObjectMetadata


@dataclass(frozen=True, slots=True)
class RemoveObject:
    object_id: ObjectId


@dataclass(frozen=True, slots=True)
class PutStreamSetObject:
    stream_set_object: StreamSetObject


@dataclass(frozen=True, slots=True)
class RemoveStreamSetObject:
    object_id: ObjectId


@dataclass(frozen=True, slots=True)
class PutStreamObject:
    stream_object: StreamObject


@dataclass(frozen=True, slots=True)
class RemoveStreamObject:
    object_id: ObjectId


@dataclass(frozen=True, slots=True)
class PutKv:
    key: str
    value: bytes


@dataclass(frozen=True, slots=True)
class RemoveKv:
    key: str


# -- cluster session state (not copied to the bucket: s3stream.metadata.sqlite_copy.SESSION_CHANGES) --


@dataclass(frozen=True, slots=True)
class PutNodeRuntime:
    """The node's whole runtime row (WAL path, un-uploaded WAL bytes)."""

    runtime: NodeRuntime


@dataclass(frozen=True, slots=True)
class PutTakeover:
    """The dead node's whole takeover row (one per node)."""

    takeover: TakeoverInfo


@dataclass(frozen=True, slots=True)
class PutAssignment:
    """The stream's whole assignment row (one per stream)."""

    assignment: Assignment


@dataclass(frozen=True, slots=True)
class RemoveAssignment:
    stream_id: StreamId


# -- object placement over several buckets (s3stream.metadata.placement_ops) ----------------------


@dataclass(frozen=True, slots=True)
class PutPlacement:
    """One ``object_buckets`` row: bucket ``bucket_id`` holds object ``object_id``."""

    object_id: ObjectId
    bucket_id: int


@dataclass(frozen=True, slots=True)
class RemovePlacements:
    """Every ``object_buckets`` row of the object (written with its RemoveObject)."""

    object_id: ObjectId


Change = (
    SetCounter
    | PutNode
    | PutLease
    | RemoveLease
    | PutStream
    | RemoveStream
    | PutRange
    | AdvanceEndOffsets
    | RemoveRange
    | PutObject
    | RemoveObject
    | PutStreamSetObject
    | RemoveStreamSetObject
    | PutStreamObject
    | RemoveStreamObject
    | PutKv
    | RemoveKv
    | PutNodeRuntime
    | PutTakeover
    | PutAssignment
    | RemoveAssignment
    | PutPlacement
    | RemovePlacements
)
