"""Sampling profiles of workloads (``--profile``): where the benchmark process spends its CPU.

While a workload runs, `py-spy <https://github.com/benfred/py-spy>`_ samples this process (and with
``--profile-children`` the processes it starts) from outside, so the workload's own code is not changed and a sample costs the
engine little: without ``--profile-native`` py-spy reads the stacks without pausing the process.
Each workload's samples go to ``<out>/profiles/<workload>.folded`` (folded stacks, one
``frame;frame;... count`` line each: the input of flame graph tools), and a summary beside it
(``<workload>.md``, and under ``profile`` in the results JSON):

- **self**: the frames samples ended in, i.e. where the CPU was (a C function called from Python
  shows as the Python function calling it, unless ``--profile-native``);
- **total**: the frames samples passed through (a function and everything it called);
- **layer**: self samples by where the code lives (``s3stream/engine``, ``wal``, ``aiobotocore``,
  ``asyncio`` ...), which answers "which layer costs the CPU" at a glance.

Idle threads (waiting in ``epoll`` or on a lock) are not sampled, so the shares are of CPU time.
A workload's baseline runs in the same process and is in the same profile; ``python -m
benchmarks.profiling FILE --under NAME`` keeps only the samples whose stack passes through a frame
containing ``NAME`` (e.g. the engine section's function) and prints the same tables for them.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PY_SPY = "py-spy"
RATE_HZ_DEFAULT = 100
TOP_DEFAULT = 25
ATTACH_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 60.0


class ProfileError(Exception):
    """Profiling was asked for and cannot be done (no py-spy, or it cannot attach)."""


def find_py_spy() -> str:
    """py-spy next to this interpreter (a virtualenv's ``bin``), else on ``PATH``."""
    beside = Path(sys.executable).parent / PY_SPY
    if beside.exists():
        return str(beside)
    found = shutil.which(PY_SPY)
    if found is None:
        raise ProfileError(
            "--profile needs py-spy (pip install py-spy, or the package's `bench` extra); not found beside "
            f"{sys.executable} or on PATH"
        )
    return found


@dataclass
class Profile:
    """The summary of one folded-stack file."""

    path: str
    samples: int
    self_frames: list[tuple[str, int]] = field(default_factory=list)
    total_frames: list[tuple[str, int]] = field(default_factory=list)
    layers: list[tuple[str, int]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "samples": self.samples,
            "self": [[frame, n] for frame, n in self.self_frames],
            "total": [[frame, n] for frame, n in self.total_frames],
            "layers": [[layer, n] for layer, n in self.layers],
        }

    def to_markdown(self, title: str) -> str:
        lines = [f"# Profile: {title}", "", f"{self.samples} samples (`{self.path}`).", ""]
        for heading, rows in (
            ("Self (where the CPU was)", self.self_frames),
            ("Total (the frame and what it called)", self.total_frames),
            ("Self by layer", self.layers),
        ):
            lines += [f"## {heading}", "", "| share | samples | frame |", "| ---: | ---: | --- |"]
            lines += [f"| {100.0 * n / max(1, self.samples):.1f} % | {n} | `{frame}` |" for frame, n in rows]
            lines.append("")
        return "\n".join(lines)


def parse_folded(lines: Iterable[str]) -> Counter[tuple[str, ...]]:
    """Stacks (outermost frame first) and their sample counts from folded-stack lines."""
    stacks: Counter[tuple[str, ...]] = Counter()
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not stack or not count.isdigit():
            continue
        stacks[tuple(stack.split(";"))] += int(count)
    return stacks


def _is_process_frame(frame: str) -> bool:
    return frame.startswith("process ")


def frame_key(frame: str) -> str:
    """A frame as the tables count it: Python frames as py-spy names them (``--function``: by the
    function's first line); native frames by function and file without the line, and an unnamed
    address by its library only (``? (libc.so.6)``)."""
    name, sep, where = frame.rpartition(" (")
    if not sep or ".py:" in where or where.startswith("<"):
        return frame
    where = where.rstrip(")")
    path, colon, line = where.rpartition(":")
    if colon and line.isdigit():
        where = path
    if name.startswith("0x"):
        name = "?"
    return f"{name} ({where})"


def layer_of(frame: str) -> str:
    """Where a frame's code lives: ``s3stream/engine`` for the engine's modules, the top package
    (``aiobotocore``, ``asyncio``, ``wal``) otherwise; ``native`` for a frame without a Python file."""
    _, sep, where = frame.rpartition(" (")
    if not sep:
        return "native"
    path = where.rstrip(")").rpartition(":")[0] or where.rstrip(")")
    if path.startswith("<frozen "):
        return "python (import machinery)"
    parts = [part for part in path.split("/") if part]
    if not parts:
        return "native"
    if parts[0] == "s3stream" and len(parts) > 2:
        return f"s3stream/{parts[1]}"
    if len(parts) == 1:
        return "python" if parts[0].endswith(".py") else parts[0]
    return parts[0]


def summarize(
    stacks: Counter[tuple[str, ...]], *, path: str, under: str | None = None, top: int = TOP_DEFAULT
) -> Profile:
    """Self, total and per-layer tables of ``stacks``; with ``under``, only the stacks through a frame
    containing it (a function's frame, or a process's: ``process PID:"command line"``)."""
    self_counts: Counter[str] = Counter()
    total_counts: Counter[str] = Counter()
    layer_counts: Counter[str] = Counter()
    samples = 0
    for stack, n in stacks.items():
        if under is not None and not any(under in frame for frame in stack):
            continue  # process frames count too: ``--under pyspark.daemon`` keeps Spark's workers
        frames = [frame_key(frame) for frame in stack if not _is_process_frame(frame)]
        samples += n
        leaf = frames[-1] if frames else (stack[-1] if stack else "?")
        self_counts[leaf] += n
        layer_counts[layer_of(leaf) if frames else "native"] += n
        for frame in set(frames):
            total_counts[frame] += n
    return Profile(
        path=path,
        samples=samples,
        self_frames=self_counts.most_common(top),
        total_frames=total_counts.most_common(top),
        layers=layer_counts.most_common(),
    )


def summarize_file(folded: Path, *, under: str | None = None, top: int = TOP_DEFAULT) -> Profile:
    with folded.open(encoding="utf-8", errors="replace") as f:
        return summarize(parse_folded(f), path=str(folded), under=under, top=top)


class Sampler:
    """py-spy sampling this process while the ``with`` block runs; the folded stacks go to ``output``.

    ``cpus``: where py-spy itself runs (the server's side under ``--pin``, so its work is not on the
    engine's CPU). ``native``: also C frames, at the price of pausing the process for each sample.
    ``children``: the processes it starts too (node processes, Spark's Python workers).
    """

    def __init__(
        self,
        output: Path,
        *,
        py_spy: str | None = None,
        rate_hz: int = RATE_HZ_DEFAULT,
        native: bool = False,
        cpus: Sequence[int] | None = None,
        pid: int | None = None,
        children: bool = False,
    ) -> None:
        self.output = output
        self.log_path = output.with_suffix(".log")
        self._py_spy = py_spy or find_py_spy()
        self._rate_hz = rate_hz
        self._native = native
        self._cpus = set(cpus) if cpus else None
        self._pid = os.getpid() if pid is None else pid
        self._children = children
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Sampler:
        self.output.parent.mkdir(parents=True, exist_ok=True)
        argv = [
            self._py_spy,
            "record",
            "--pid",
            str(self._pid),
            "--rate",
            str(self._rate_hz),
            "--function",
            "--format",
            "raw",
            "--output",
            str(self.output),
        ]
        argv.append("--native" if self._native else "--nonblocking")
        if self._children:  # py-spy then keeps scanning for new processes: ~0.4 of a CPU on its side
            argv.append("--subprocesses")
        cpus = self._cpus
        with self.log_path.open("wb") as log:
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
            )
        self._wait_attached()
        return self

    def _wait_attached(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + ATTACH_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise ProfileError(f"py-spy exited at once: {self._log_tail()}")
            if b"Sampling process" in self.log_path.read_bytes():
                return
            time.sleep(0.05)
        self._stop()
        raise ProfileError(f"py-spy did not attach within {ATTACH_TIMEOUT_S:.0f} s: {self._log_tail()}")

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace").strip()[-500:] or "(no output)"
        except OSError:
            return "(no output)"

    def _stop(self) -> int | None:
        proc = self._proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # py-spy writes its output on Ctrl-C
            try:
                proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return proc.returncode

    def __exit__(self, *exc: object) -> None:
        self._stop()

    def profile(self, *, top: int = TOP_DEFAULT) -> Profile:
        """The summary of what was sampled (:class:`ProfileError` if py-spy wrote nothing)."""
        if not self.output.exists():
            raise ProfileError(f"py-spy wrote no samples to {self.output}: {self._log_tail()}")
        return summarize_file(self.output, top=top)


def sampler_factory(
    profile_dir: Path,
    *,
    py_spy: str,
    native: bool = False,
    children: bool = False,
    rate_hz: int = RATE_HZ_DEFAULT,
    cpus: Sequence[int] | None = None,
) -> Callable[[str], Sampler]:
    """What the harness calls per workload: a :class:`Sampler` writing ``<profile_dir>/<name>.folded``."""

    def make(name: str) -> Sampler:
        return Sampler(
            profile_dir / f"{name}.folded",
            py_spy=py_spy,
            native=native,
            children=children,
            rate_hz=rate_hz,
            cpus=cpus,
        )

    return make


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.profiling",
        description="Summarize a folded-stack profile written by `python -m benchmarks --profile`.",
    )
    parser.add_argument("folded", type=Path, help="a <workload>.folded file")
    parser.add_argument("--under", help="only samples whose stack passes through a frame containing this")
    parser.add_argument("--top", type=int, default=TOP_DEFAULT, help="rows per table")
    args = parser.parse_args(argv)
    if not args.folded.is_file():
        print(f"no such file: {args.folded}", file=sys.stderr)
        return 2
    profile = summarize_file(args.folded, under=args.under, top=args.top)
    title = args.folded.stem + (f", under `{args.under}`" if args.under else "")
    print(profile.to_markdown(title))
    return 0 if profile.samples else 1


if __name__ == "__main__":
    sys.exit(main())
