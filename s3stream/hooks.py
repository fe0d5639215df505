"""Calling observers (metrics hooks) from I/O paths: a hook must never change what the path does.

:func:`call_hook` runs a hook and swallows any Exception it raises: a meter that fails after a
successful attempt must not turn it into a failure (and a retry), nor replace the error of a failed
one. The first failure of each hook is logged (``hook.failed``); later ones are not, so a broken
meter does not flood the log.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import ParamSpec

from s3stream.logfmt import log_event

log = logging.getLogger(__name__)
P = ParamSpec("P")

_failed: set[str] = set()


def call_hook(name: str, hook: Callable[P, object], *args: P.args, **kwargs: P.kwargs) -> None:
    """``hook(*args, **kwargs)``; an Exception it raises is logged once per ``name`` and ignored."""
    try:
        hook(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - an observer must never fail the I/O it observes
        if name not in _failed:
            _failed.add(name)
            log_event(log, logging.ERROR, "hook.failed", hook=name, error=f"{type(exc).__name__}: {exc}", action="ignored, logged once")  # fmt: skip
