"""A background task cancelled before it ever ran leaves no coroutine behind that was never awaited.

Found by the cluster soak: a node fenced right after an upload was spawned logged "coroutine
'UploadPipeline._upload' was never awaited" (the fence cancels every task, some before their first
step); under ``-W error`` such a warning fails whatever test collects it.
"""

from __future__ import annotations

import asyncio
import gc
import warnings

from s3stream.engine.supervisor import Supervisor
from s3stream.errors import S3StreamError


async def test_a_task_cancelled_before_its_first_step_closes_its_coroutine() -> None:
    failures: list[S3StreamError] = []
    supervisor = Supervisor(failures.append)
    started: list[bool] = []

    async def work() -> None:
        started.append(True)

    supervisor.spawn(work(), name="never-started")
    supervisor.cancel_tasks()  # before the loop ran the task once
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        gc.collect()
    assert started == []
    assert not supervisor.tasks
    assert [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)] == []
    assert failures == []
