"""Crash-test compaction runner: opens the engine on a data dir and compacts it, until killed.

Usage: python -m tests.crash.compaction_runner DATA_DIR KILL_AT KILL_COUNT

``KILL_AT`` is ``before_commit`` (new objects written, nothing committed), ``after_commit`` (the
commit is durable, the replaced objects are marked but not deleted) or ``after_delete`` (the garbage
collector deleted a batch of marked objects from the bucket, metadata still lists them): the process
SIGKILLs itself the ``KILL_COUNT``-th time it reaches that point, in StreamSet or stream object
compaction. ``random``: no stop point; the test kills it at a random moment. Prints ``STARTED`` once
the engine is open and ``DONE`` if the run finished before the kill.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from compaction.compactor import Compactor
from compaction.observer import CompactionObserver
from s3stream.assembly import open_client
from tests.crash.backend import bucket_uri, engine_config
from tests.crash.compaction_data import CONFIG


class KillObserver(CompactionObserver):
    def __init__(self, kill_at: str, kill_count: int) -> None:
        self.kill_at = kill_at
        self.remaining = kill_count

    def _point(self, name: str) -> None:
        if name == self.kill_at:
            self.remaining -= 1
            if self.remaining <= 0:
                print(f"KILL {name}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)

    async def before_commit(self) -> None:
        self._point("before_commit")

    async def after_commit(self) -> None:
        self._point("after_commit")

    async def after_delete(self) -> None:
        self._point("after_delete")


async def main(argv: list[str]) -> None:
    data_dir, kill_at, kill_count = argv[0], argv[1], int(argv[2])
    client = await open_client(data_dir, config=engine_config(CONFIG), bucket_uri=bucket_uri())
    engine = client.engine
    print("STARTED", flush=True)
    compactor = Compactor(
        CONFIG,
        engine.metadata,
        engine.storage,
        node_id=engine.node_id,
        node_epoch=engine.node_epoch,
        observer=KillObserver(kill_at, kill_count),
    )
    report = await compactor.run_once(stream_objects=True)
    print(f"DONE {report.summary()}", flush=True)
    await client.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
