"""The metrics twin used when metrics are off: the same calls, doing nothing.

The components are not wired to it (their hooks stay None and nothing is wrapped), so metrics off
cost the hot paths nothing; it exists for the callers above the engine (the Spark sink, the CLI)
that report through ``client.metrics`` whether or not metrics are on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class NoopMetrics:
    """Every hook of :class:`~s3stream.metrics.node.NodeMetrics`, each a no-op."""

    enabled = False
    endpoint: str | None = None

    def attach_engine(self, engine: Any) -> None:
        """Nothing: the engine runs unwrapped."""

    def attach_storage(self, storage: object) -> None:
        """Nothing."""

    def attach_compaction(self, compactor: Any, collectors: Sequence[Any]) -> None:
        """Nothing."""

    def attach_heartbeat(self, heartbeat: Any) -> None:
        """Nothing."""

    def spark_batch(self, *, path: str, outcome: str, rows: int, commit_s: float | None) -> None:
        """Nothing."""

    async def close(self) -> None:
        """Nothing to stop."""


NOOP_METRICS = NoopMetrics()
"""The one shared instance (it holds no state)."""
