"""What both compaction executors write as: the stores, the object namespace, the node, the TTL."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from compaction.observer import CompactionObserver
from s3stream.ids import NodeId
from s3stream.metadata.base import MetadataStore
from s3stream.storage.base import ObjectStorage


@dataclass(frozen=True, slots=True)
class WriteTarget:
    """Where new objects go and whose commits they are (one per :class:`~compaction.compactor.Compactor`).

    ``prepared_ttl_ms``: how long a prepared object id stays reserved before the garbage collector may
    delete what was uploaded under it. ``observer``: told of each commit (before and after).
    """

    metadata: MetadataStore
    storage: ObjectStorage
    namespace: str
    node_id: NodeId
    node_epoch: int
    prepared_ttl_ms: int
    observer: CompactionObserver = dataclasses.field(default_factory=CompactionObserver)


class TargetedExecutor:
    """Base of the executors: the target's parts as attributes, read on every commit."""

    def __init__(self, target: WriteTarget) -> None:
        self.target = target
        self.metadata = target.metadata
        self.storage = target.storage
        self.namespace = target.namespace
        self.node_id = target.node_id
        self.node_epoch = target.node_epoch
        self.prepared_ttl_ms = target.prepared_ttl_ms
        self.observer = target.observer
