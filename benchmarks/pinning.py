"""``--pin``: the benchmark process on one CPU, the S3 server's processes on the others.

On a small machine the S3 server (a local Ceph RGW: monitor, OSD and gateway) shares the engine's
cores, and a wall-clock ratio then mostly measures who got the CPU. ``--pin`` separates them:

- the benchmark process, every thread it has now (``/proc/self/task``) and every thread or process it
  starts later (they inherit the mask), runs on ``--pin-cpu`` (default CPU 0);
- the server's processes (every thread of each) run on all the other CPUs of the machine's affinity
  set: the project's Ceph RGW daemons (the PIDs in ``<data dir>/run/*.pid``, the data dir being
  ``S3STREAM_CEPH_DIR`` or ``<repo>/.ceph-rgw``) when the target is that server, plus any
  ``--server-pid PID[,PID...]``;
- processes a workload pins itself (node processes of ``metadata`` and ``reassign``) go round robin
  over :attr:`PinPlan.child_cpus`, the set the benchmark had before pinning (what they had before);
  the others (Spark's JVM, helper processes) inherit the benchmark's one CPU, so the engine's work in
  them is on the engine's side of the split.

The server's affinities are restored by :meth:`PinPlan.restore` (the harness calls it when the run
ends, also on errors); the benchmark process's own are restored too. One run at a time pins
servers (a lock file, :data:`LOCK_NAME`). Invariant: while a plan is applied, the benchmark CPU and
the server CPUs are disjoint and both non-empty.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LOCK_NAME = "s3stream-bench-pin.lock"
"""The lock file (in the system's temp directory) a run holds while it pins server processes."""
CEPH_PID_FILES = ("mon.a.pid", "osd.0.pid", "client.rgw.a.pid")
"""The daemons ``scripts/ceph-rgw`` starts, by pid file name in ``<data dir>/run/``."""


class PinError(Exception):
    """Pinning cannot be done (one CPU, no such CPU or PID, no permission): exit status 2."""


def ceph_data_dir(repo_root: Path, environ: dict[str, str] | None = None) -> Path:
    """The data directory ``scripts/ceph-rgw`` uses: ``S3STREAM_CEPH_DIR`` or ``<repo>/.ceph-rgw``."""
    env = os.environ if environ is None else environ
    return Path(env.get("S3STREAM_CEPH_DIR") or repo_root / ".ceph-rgw")


def ceph_pids(data_dir: Path) -> dict[int, str]:
    """PID -> daemon name of the Ceph RGW daemons running from ``data_dir``; :class:`PinError` if a pid
    file is missing or its process is gone."""
    pids: dict[int, str] = {}
    for name in CEPH_PID_FILES:
        pid_file = data_dir / "run" / name
        try:
            pid = int(pid_file.read_text().strip())
        except (OSError, ValueError) as exc:
            raise PinError(
                f"cannot read {pid_file} ({exc}): is the Ceph RGW running from {data_dir}? "
                "Set S3STREAM_CEPH_DIR to its data directory or pass --server-pid"
            ) from exc
        if not Path(f"/proc/{pid}").exists():
            raise PinError(f"{pid_file} names PID {pid}, which is not running (scripts/ceph-rgw status)")
        pids[pid] = name.removesuffix(".pid")
    return pids


def parse_pids(text: str) -> list[int]:
    """``--server-pid 12,34`` -> [12, 34]; :class:`PinError` on anything that is not a positive int."""
    pids: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if not part.isdigit() or int(part) <= 0:
            raise PinError(f"--server-pid wants PID[,PID...], got {text!r}")
        pids.append(int(part))
    return pids


def thread_ids(pid: int | str) -> list[int]:
    """Every thread of process ``pid`` (``/proc/<pid>/task``); :class:`PinError` if there is none."""
    try:
        return sorted(int(tid) for tid in os.listdir(f"/proc/{pid}/task"))
    except FileNotFoundError as exc:
        raise PinError(f"no such process: PID {pid}") from exc
    except OSError as exc:
        raise PinError(f"cannot list the threads of PID {pid}: {exc}") from exc


def _set_threads(pid: int | str, cpus: set[int], saved: dict[int, set[int]]) -> None:
    """Set every thread of ``pid`` to ``cpus``, saving each thread's mask first into ``saved``."""
    for tid in thread_ids(pid):
        try:
            saved.setdefault(tid, set(os.sched_getaffinity(tid)))
            os.sched_setaffinity(tid, cpus)
        except ProcessLookupError:
            continue  # the thread ended between the listing and the call
        except PermissionError as exc:
            raise PinError(f"no permission to set the CPU affinity of PID {pid} (thread {tid})") from exc
        except OSError as exc:
            raise PinError(f"cannot set the CPU affinity of PID {pid} to {sorted(cpus)}: {exc}") from exc


def _mask_of(pid: int) -> list[int]:
    with contextlib.suppress(OSError):
        return sorted(os.sched_getaffinity(pid))
    return []


@dataclass
class PinPlan:
    """Who runs where under ``--pin``; :meth:`apply` makes it so, :meth:`restore` undoes it."""

    bench_cpu: int
    server_cpus: list[int]
    server_pids: dict[int, str]
    """PID -> what it is (a Ceph daemon name, or ``--server-pid``)."""
    child_cpus: list[int]
    """The benchmark's CPUs before pinning: workloads pin the processes they start round robin here."""
    lock_path: Path = field(default_factory=lambda: Path(tempfile.gettempdir()) / LOCK_NAME)
    """Held (``flock``) while server processes are pinned: a second ``--pin`` run at the same time
    would save the first one's masks as the servers' own and leave them pinned when it restores."""
    _lock_fd: int | None = field(default=None, repr=False)
    _saved_self: dict[int, set[int]] = field(default_factory=dict, repr=False)
    _saved_server: dict[int, dict[int, set[int]]] = field(default_factory=dict, repr=False)
    applied: bool = False

    @classmethod
    def make(
        cls,
        *,
        bench_cpu: int,
        server_pids: dict[int, str],
        available_cpus: Iterable[int] | None = None,
    ) -> PinPlan:
        """Plan the split over ``available_cpus`` (default: this process's affinity set): the
        benchmark on ``bench_cpu``, the servers on the rest. :class:`PinError` if that is not
        possible (one CPU, ``bench_cpu`` outside the set, a PID that does not exist)."""
        cpus = sorted(os.sched_getaffinity(0) if available_cpus is None else set(available_cpus))
        if len(cpus) < 2:
            raise PinError(f"--pin needs at least 2 CPUs to split the benchmark from the server; have {cpus}")
        if bench_cpu not in cpus:
            raise PinError(f"--pin-cpu {bench_cpu} is not one of the CPUs this process may use: {cpus}")
        for pid in server_pids:
            if not Path(f"/proc/{pid}").exists():
                raise PinError(f"no such process: PID {pid}")
        return cls(
            bench_cpu=bench_cpu,
            server_cpus=[cpu for cpu in cpus if cpu != bench_cpu],
            server_pids=dict(server_pids),
            child_cpus=cpus,
        )

    def apply(self) -> None:
        """Pin the servers' threads, then this process's. On a :class:`PinError` what was already
        changed is restored before it propagates."""
        assert self.bench_cpu not in self.server_cpus
        assert self.server_cpus
        self.applied = True
        try:
            if self.server_pids:
                self._lock_fd = _take_lock(self.lock_path)
            for pid in self.server_pids:
                _set_threads(pid, set(self.server_cpus), self._saved_server.setdefault(pid, {}))
            _set_threads("self", {self.bench_cpu}, self._saved_self)
        except PinError:
            self.restore()
            raise

    def restore(self) -> list[str]:
        """Put back every saved mask (threads born since get their process's main thread's old mask).
        Returns problems as text (a server that exited meanwhile is not one)."""
        problems: list[str] = []
        for pid, saved in self._saved_server.items():
            problems += _restore(pid, saved)
        problems += _restore(os.getpid(), self._saved_self)
        self._saved_server.clear()
        self._saved_self.clear()
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None
        self.applied = False
        return problems

    def to_json(self) -> dict[str, Any]:
        """The affinities for the results JSON (read from the kernel when called)."""
        return {
            "bench_pid": os.getpid(),
            "bench_cpu": self.bench_cpu,
            "bench_cpus_now": _mask_of(0),
            "server_cpus": self.server_cpus,
            "servers": [
                {"pid": pid, "name": name, "cpus_now": _mask_of(pid)}
                for pid, name in sorted(self.server_pids.items())
            ],
            "child_cpus": self.child_cpus,
            "children": (
                "node processes a workload pins itself: round robin over child_cpus; any other process "
                "a workload starts (Spark's JVM, helpers) inherits bench_cpu"
            ),
        }


def _take_lock(path: Path) -> int:
    """An exclusive ``flock`` on ``path`` (created if missing), or :class:`PinError` if it is held."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as exc:
        raise PinError(f"cannot open the pinning lock {path}: {exc}") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        raise PinError(
            f"another --pin run is pinning server processes (lock {path} is held): run one at a time, "
            "or its end would restore the other's masks as the servers' own"
        ) from exc
    return fd


def _restore(pid: int, saved: dict[int, set[int]]) -> list[str]:
    if not saved:
        return []
    fallback = saved.get(pid) or next(iter(saved.values()))
    problems: list[str] = []
    try:
        tids = thread_ids(pid)
    except PinError:
        return []  # the process is gone: nothing to restore
    for tid in tids:
        try:
            os.sched_setaffinity(tid, saved.get(tid, fallback))
        except ProcessLookupError:
            continue
        except OSError as exc:
            problems.append(f"could not restore the CPU affinity of PID {pid} thread {tid}: {exc}")
    return problems


@contextlib.contextmanager
def pinned(plan: PinPlan | None) -> Iterator[PinPlan | None]:
    """Apply ``plan`` (None: nothing) for the block and restore it after, also on errors (a mask
    that could not be restored is reported on stderr)."""
    if plan is None:
        yield None
        return
    plan.apply()
    try:
        yield plan
    finally:
        for problem in plan.restore():
            print(f"warning: {problem}", file=sys.stderr)
