"""Typed ids of the domain: streams, objects, nodes."""

from __future__ import annotations

from typing import NewType

StreamId = NewType("StreamId", int)
ObjectId = NewType("ObjectId", int)
NodeId = NewType("NodeId", int)

NOOP_OBJECT_ID = ObjectId(-1)
"""AutoMQ's sentinel for "no object" (e.g. a commit without a StreamSet object)."""
