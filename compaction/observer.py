"""The points of the compaction commit protocol that an observer is told about (no-ops by default)."""

from __future__ import annotations


class CompactionObserver:
    """Every executor calls these around each commit, the garbage collector after each delete; each
    call is awaited, so an observer may also hold the executor at that point."""

    async def before_commit(self) -> None:
        """Every new object of the commit is written; nothing is committed yet."""

    async def after_commit(self) -> None:
        """The commit is durable; the replaced objects are marked destroyed, not yet deleted."""

    async def after_delete(self) -> None:
        """A batch of marked objects is deleted from the bucket; metadata still lists them."""
