"""A Spark standalone cluster on this machine whose workers have distinct host names (for speculation).

Spark never launches a speculative copy of a task on a host where an attempt of it already runs, and
every executor of ``local-cluster[...]`` (and of ``local[...]``, where speculation is off anyway)
has the same host. :func:`standalone_cluster` starts a master on 127.0.0.1 and each worker on its own
loopback address (127.0.0.2, 127.0.0.3, ...; Linux routes all of 127/8 to the loopback device) with
the ``spark-class`` script of the pip-installed pyspark, so a driver with ``--master`` set to the
yielded URL gets executors on different "hosts". Every process is started in its own session and its
whole process group is ended at exit (SIGTERM, then SIGKILL): the workers' executors go with them.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

START_TIMEOUT_S = 180.0
"""How long the master may take to listen and the workers to register (JVM starts on a loaded machine)."""
_PORT = re.compile(r"Successfully started service 'sparkMaster' on port (\d+)")
_REGISTERED = "Registering worker "


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def _wait_for(log: Path, pattern: re.Pattern[str] | str, count: int, deadline: float) -> list[str]:
    while True:
        text = log.read_text(errors="replace") if log.exists() else ""
        if isinstance(pattern, str):
            found = [line for line in text.splitlines() if pattern in line]
        else:
            found = pattern.findall(text)
        if len(found) >= count:
            return found
        if time.monotonic() > deadline:
            raise TimeoutError(f"{log.name}: {pattern!r} seen {len(found)} of {count} times:\n{text[-3000:]}")
        time.sleep(0.2)


def _end(procs: list[subprocess.Popen[bytes]]) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for proc in procs:  # the group outlives its leader when an executor is still running
            with suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            time.sleep(0.2)
    for proc in procs:
        proc.wait(timeout=10)


@contextmanager
def standalone_cluster(
    work_dir: Path, env: dict[str, str], *, workers: int = 2, worker_memory: str = "1g"
) -> Iterator[str]:
    """A master and ``workers`` one-core workers; yields the master URL (``spark://127.0.0.1:<port>``)."""
    work_dir.mkdir(parents=True, exist_ok=True)
    spark_class = str(_spark_home() / "bin" / "spark-class")
    base = dict(env, SPARK_HOME=str(_spark_home()), SPARK_LOCAL_IP="127.0.0.1")
    procs: list[subprocess.Popen[bytes]] = []
    deadline = time.monotonic() + START_TIMEOUT_S

    def start(name: str, args: list[str], host: str) -> Path:
        log = work_dir / f"{name}.log"
        with log.open("wb") as out:
            procs.append(
                subprocess.Popen(
                    [spark_class, *args],
                    env=dict(base, SPARK_LOCAL_IP=host),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        return log

    try:
        master_log = start(
            "master",
            [
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--webui-port",
                "0",
            ],
            "127.0.0.1",
        )
        port = int(_wait_for(master_log, _PORT, 1, deadline)[0])
        url = f"spark://127.0.0.1:{port}"
        for i in range(workers):
            host = f"127.0.0.{i + 2}"
            start(
                f"worker-{i}",
                [
                    "org.apache.spark.deploy.worker.Worker",
                    "--host",
                    host,
                    "--webui-port",
                    "0",
                    "--cores",
                    "1",
                    "--memory",
                    worker_memory,
                    "--work-dir",
                    str(work_dir / f"worker-{i}"),
                    url,
                ],
                host,
            )
        _wait_for(master_log, _REGISTERED, workers, deadline)
        yield url
    finally:
        _end(procs)
