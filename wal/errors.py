"""The WAL's error kinds: one root, each kind telling the caller what to do.

The engine translates these to s3stream's kinds at its assembly boundary; ``wal`` itself imports
nothing of s3stream.

| kind                 | what the caller should do                                        |
|----------------------|------------------------------------------------------------------|
| InvalidWalConfig     | fix the configuration (bad value, capacity mismatch with device) |
| WalArgumentError     | fix the call (record too large, trim beyond the end)             |
| WalCapacityError     | the ring is full of untrimmed records: trim, then retry          |
| WalLockedError       | another process (or handle) has the WAL open: stop               |
| WalFencedError       | the header carries a newer node epoch: this node is fenced       |
| WalClosedError       | the WAL is closed (or failed): reopen                            |
| WalStateError        | call order is wrong (append before recover() finished)           |
| WalIOError           | the device failed; the WAL is unusable until reopened            |
| WalCorruptionError   | persisted bytes failed validation outside the recovery rule      |
"""

from __future__ import annotations


class WalError(Exception):
    """Root of every error the WAL raises."""

    retriable: bool = False


class InvalidWalConfig(WalError, ValueError):
    """A configuration value is out of range, or the device does not match the configuration."""


class WalArgumentError(WalError, ValueError):
    """The call is wrong: record larger than ``record_max_bytes``, trim beyond the end, ..."""


class WalCapacityError(WalError):
    """The ring holds no room for the record until something is trimmed."""

    retriable = True


class WalLockedError(WalError):
    """Another process or handle holds the WAL's lock: two writers must never interleave."""


class WalFencedError(WalError):
    """The WAL header carries a node epoch newer than ours: another owner took over."""


class WalClosedError(WalError):
    """The WAL is closed, or failed and refuses further work."""


class WalStateError(WalError):
    """Operations were called out of order (append before ``recover()`` ran to the end)."""


class WalIOError(WalError):
    """A device read, write or sync failed; every pending append fails with this."""

    retriable = True


class WalCorruptionError(WalError):
    """Persisted bytes failed validation in a way the recovery rule does not explain.

    ``position`` is the physical byte position on the device, ``offset`` the logical offset.
    """

    def __init__(self, message: str, *, position: int, offset: int | None = None) -> None:
        super().__init__(
            f"{message} (position {position}" + (f", offset {offset})" if offset is not None else ")")
        )
        self.position = position
        self.offset = offset
