"""Process heap tuning for applications: :func:`freeze_startup_heap` once start-up is over."""

from __future__ import annotations

import gc


def freeze_startup_heap() -> int:
    """Collect garbage once, then move every object alive now out of the collector's way
    (:func:`gc.freeze`); returns how many objects are frozen.

    Call it once the application has started (engine open, streams opened). A full collection
    scans every tracked object that is not frozen; after start-up most of them (modules, botocore's
    S3 client and models, the engine's own structures) live as long as the process, so each full
    collection, and the event-loop stall it causes, is several times shorter. Objects created later
    are collected as usual; frozen objects that become unreachable are still freed by reference
    counting, only cycles among them stay until :func:`gc.unfreeze`. The collector stays enabled.
    See docs/architecture.md, "Latency and Python's garbage collector"."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
