"""Points in the executors where crash tests stop the process (no-ops by default)."""

from __future__ import annotations


class CompactionHooks:
    """Subclassed by crash tests; every executor calls these around each commit, the garbage
    collector around each delete."""

    async def before_commit(self) -> None:
        """Every new object of the commit is written; nothing is committed yet."""

    async def after_commit(self) -> None:
        """The commit is durable; the replaced objects are marked destroyed, not yet deleted."""

    async def after_delete(self) -> None:
        """A batch of marked objects is deleted from the bucket; metadata still lists them."""
