"""The benchmark result type and run context shared by every workload.

A workload is a module ``benchmarks/workloads/<name>.py`` exposing
``async def run(ctx: Context) -> list[Result]``. Every result names the baseline it was compared
with, measured in the same run, and the ratio value / baseline_value (for "lower is better" metrics
the workload says so in ``higher_is_better``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


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

    @property
    def ratio(self) -> float:
        return self.value / self.baseline_value if self.baseline_value else float("nan")

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["ratio"] = self.ratio
        return out


@dataclass(frozen=True)
class S3Target:
    endpoint: str
    access_key: str
    secret_key: str
    bucket: str
    region: str = "us-east-1"


@dataclass
class Context:
    quick: bool
    work_dir: Path
    """A scratch directory on the local disk (WAL files, local object store)."""
    s3: S3Target | None
    """The S3 endpoint to run against; None runs on the local filesystem store only."""
    notes: list[str] = field(default_factory=list)
