"""Event loop selection: uvloop wherever it is installed, the default asyncio loop otherwise."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from types import ModuleType
from typing import Any, TypeVar

T = TypeVar("T")

_uvloop: ModuleType | None
try:  # pragma: no cover - depends on the platform
    import uvloop as _uvloop
except ImportError:  # pragma: no cover
    _uvloop = None


def uvloop_available() -> bool:
    return _uvloop is not None


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new event loop: uvloop's if installed."""
    if _uvloop is not None:
        loop: asyncio.AbstractEventLoop = _uvloop.new_event_loop()
        return loop
    return asyncio.new_event_loop()


def run(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on uvloop where it is installed."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(coro)
