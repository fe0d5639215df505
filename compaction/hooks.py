"""Points in the executors where crash tests stop the process (no-ops by default)."""

from __future__ import annotations


class CompactionHooks:
    """Subclassed by crash tests; every executor calls these around each commit."""

    async def before_commit(self) -> None:
        """Every new object of the commit is written; nothing is committed yet."""

    async def after_commit(self) -> None:
        """The commit is durable; the replaced objects are marked destroyed, not yet deleted."""
