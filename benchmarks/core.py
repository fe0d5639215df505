"""The benchmark result type and run context shared by every workload.

A workload is a module ``benchmarks/workloads/<name>.py`` exposing
``async def run(ctx: Context) -> list[Result]``. Every result names the baseline it was compared
with, measured in the same run, and the ratio value / baseline_value (for "lower is better" metrics
the workload says so in ``higher_is_better``).

What a workload should do (the harness runs it under ``python -m benchmarks <name>``):

- size itself with ``ctx.scale(quick=..., full=...)`` (``--quick`` runs take seconds);
- do a warm-up, then a fixed duration or volume; report throughput and latency percentiles;
- measure its baseline in the same run, warmed up and right next to the figure it is compared with
  (a cold first sample of a shared server can be half its rate): :mod:`benchmarks.baselines` has raw
  O_DIRECT writes, raw aiobotocore PUT / GET, the raw PUT ceiling in the engine's upload shapes, the
  naive writer (one object per stream per flush) and SlateDB;
- report the CPU seconds per GiB of the figure's section and of its baseline's section in
  ``Result.cpu_s_per_gib`` / ``baseline_cpu_s_per_gib`` (:func:`benchmarks.measure.cpu_per_gib`
  over a :class:`~benchmarks.measure.ResourceMeter` around each section): CPU time barely moves
  with a neighbour's load where wall time does;
- put latency percentiles, CPU and memory and S3 requests per GiB in ``Result.extra`` with the keys
  of :mod:`benchmarks.measure` (``latency_ms``, ``baseline_latency_ms``, ``cpu_s``,
  ``peak_rss_bytes``, ``s3_requests_per_gib``); the harness also records CPU, peak RSS and every
  raw S3 request (botocore hook) per workload on its own;
- open object storage with ``ctx.open_storage(name)`` (the S3 target under a run-unique prefix, or
  the local filesystem store with ``--target local``), keep scratch files in ``ctx.work_dir``, and
  tell the live display what it is doing with ``ctx.status("...")``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote

if TYPE_CHECKING:
    from s3stream.storage.base import ObjectStorage

T = TypeVar("T")


@dataclass
class Result:
    workload: str
    metric: str
    value: float
    unit: str
    baseline: str
    baseline_value: float
    higher_is_better: bool = True
    extra: dict[str, Any] = field(default_factory=dict)
    cpu_s_per_gib: float | None = None
    """The engine's CPU seconds (user + system, every thread; and its child processes where it runs
    in them) per GiB of payload over the measured section of ``value`` (None: the figure moves no
    bytes, or the section's CPU cannot be told apart)."""
    baseline_cpu_s_per_gib: float | None = None
    """The same, measured the same way over the baseline's section."""

    @property
    def ratio(self) -> float:
        return self.value / self.baseline_value if self.baseline_value else float("nan")

    @property
    def cpu_ratio(self) -> float:
        """CPU s/GiB of the figure / of its baseline (lower is better); NaN when either is missing."""
        if self.cpu_s_per_gib is None or not self.baseline_cpu_s_per_gib:
            return float("nan")
        return self.cpu_s_per_gib / self.baseline_cpu_s_per_gib

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["ratio"] = self.ratio
        out["cpu_ratio"] = self.cpu_ratio
        return out


@dataclass(frozen=True)
class S3Target:
    endpoint: str
    access_key: str
    secret_key: str = field(repr=False)
    bucket: str
    region: str = "us-east-1"

    def uri(self, prefix: str = "") -> str:
        """An AutoMQ-style bucket URI with the keys inline (what ``s3stream`` commands accept)."""
        return (
            f"0@s3://{self.bucket}?region={self.region}&endpoint={quote(self.endpoint, safe=':/')}"
            f"&pathStyle=true&accessKey={quote(self.access_key)}&secretKey={quote(self.secret_key)}"
            + (f"&prefix={quote(prefix)}" if prefix else "")
        )

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``aiobotocore`` ``create_client("s3", ...)`` (path-style addressing)."""
        from aiobotocore.config import AioConfig

        return {
            "endpoint_url": self.endpoint,
            "region_name": self.region,
            "aws_access_key_id": self.access_key,
            "aws_secret_access_key": self.secret_key,
            "config": AioConfig(
                s3={"addressing_style": "path"},
                max_pool_connections=64,
                retries={"total_max_attempts": 3, "mode": "standard"},
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
            ),
        }

    def public(self) -> dict[str, str]:
        """Everything but the secret key (for result files)."""
        return {"endpoint": self.endpoint, "bucket": self.bucket, "region": self.region}


def _noop_status(text: str) -> None:
    del text


@dataclass
class Context:
    quick: bool
    work_dir: Path
    """A scratch directory on the local disk (WAL files, local object store)."""
    s3: S3Target | None
    """The S3 endpoint to run against; None runs on the local filesystem store only."""
    notes: list[str] = field(default_factory=list)
    """Caveats the workload wants printed under the results (e.g. "SlateDB used its local store")."""
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:10])
    """Unique per run: every object key a workload writes lives under ``bench/<run_id>/``."""
    seed: int = 0
    params: dict[str, Any] = field(default_factory=dict)
    """Workload parameters from ``--param name=value`` (strings; parse with :meth:`param`)."""
    status_sink: Callable[[str], None] = field(default=_noop_status, repr=False)
    metadata_url: str | None = field(default=None, repr=False)
    """``--metadata-url``: the metadata server a workload measures (may hold a password; never log it)."""
    pin: bool = False
    """``--pin``: workloads that start processes pin each to one core of :meth:`cpus_for_children`."""
    child_cpus: list[int] | None = None
    """Under ``--pin``: the CPUs this process had before it was pinned to one (see
    :mod:`benchmarks.pinning`); None when not pinned."""

    def cpus_for_children(self) -> list[int]:
        """The CPUs a workload pins its processes to, round robin (``--pin``): those this process had
        before the harness pinned it, else its affinity set."""
        return list(self.child_cpus) if self.child_cpus else sorted(os.sched_getaffinity(0))

    def status(self, text: str) -> None:
        """Show what the workload is doing now in the live display."""
        self.status_sink(text)

    def scale(self, *, quick: T, full: T) -> T:
        """``quick`` under ``--quick``, else ``full``."""
        return quick if self.quick else full

    def param(self, name: str, default: T) -> T:
        """``--param name=value`` converted to the type of ``default``, else ``default``."""
        raw = self.params.get(name)
        if raw is None:
            return default
        kind: Callable[[Any], T] = type(default)
        return kind(raw)

    def key_prefix(self, name: str) -> str:
        """A key prefix no other run or workload uses: ``bench/<run_id>/<name>/``."""
        return f"bench/{self.run_id}/{name.strip('/')}/"

    def scratch(self, name: str) -> Path:
        """A fresh directory under ``work_dir`` for this workload."""
        path = self.work_dir / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def open_storage(self, name: str) -> ObjectStorage:
        """The target's object store under :meth:`key_prefix` (S3), or a local store in :meth:`scratch`."""
        if self.s3 is None:
            from s3stream.storage.local import LocalObjectStorage

            return LocalObjectStorage(self.scratch(f"objects-{name}"))
        from s3stream.storage.s3 import S3Config, S3ObjectStorage

        return S3ObjectStorage(
            S3Config(
                bucket=self.s3.bucket,
                endpoint=self.s3.endpoint,
                region=self.s3.region,
                path_style=True,
                access_key=self.s3.access_key,
                secret_key=self.s3.secret_key,
                prefix=self.key_prefix(name),
                checksum_mode=os.environ.get("S3STREAM_BENCH_CHECKSUM_MODE", "when_required"),  # type: ignore[arg-type]
            ),
            seed=self.seed,
        )


Workload = Callable[[Context], Any]
"""``async def run(ctx: Context) -> list[Result]`` (the coroutine function of a workload module)."""
