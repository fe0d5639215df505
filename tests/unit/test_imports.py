"""Every module of the packages imports on its own in a fresh interpreter (no import cycles), and the
layering holds: ``wal`` imports nothing of ours, the engine no driver libraries, compaction no engine."""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("wal", "s3stream", "compaction", "spark_sink")


def _modules() -> list[str]:
    names: list[str] = []
    for package in PACKAGES:
        names.append(package)
        for info in pkgutil.walk_packages([str(ROOT / package)], prefix=f"{package}."):
            if not info.name.endswith(".__main__"):  # running a __main__ runs the program
                names.append(info.name)
    return sorted(names)


def test_every_module_imports_first_in_a_fresh_interpreter() -> None:
    # One interpreter per module would cost seconds each; instead each child imports one module first and
    # nothing else, several children in parallel.
    modules = _modules()
    failures = []
    for start in range(0, len(modules), 8):
        procs = [
            (
                name,
                subprocess.Popen([sys.executable, "-c", f"import {name}"], cwd=ROOT, stderr=subprocess.PIPE),
            )
            for name in modules[start : start + 8]
        ]
        for name, proc in procs:
            _, err = proc.communicate(timeout=120)
            if proc.returncode != 0:
                lines = err.decode(errors="replace").strip().splitlines() or ["(no output)"]
                failures.append(f"{name}: {lines[-1]}")
    assert len(modules) > 50
    assert not failures, "\n".join(failures)


def _imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        ("wal", ("s3stream", "compaction", "spark_sink")),
        ("s3stream/engine", ("aiobotocore", "botocore", "sqlite3", "s3stream.assembly", "compaction")),
        ("compaction", ("s3stream.engine", "s3stream.assembly", "spark_sink")),
        ("s3stream/metadata", ("s3stream.engine", "s3stream.storage", "compaction")),
        ("s3stream/storage", ("s3stream.engine", "s3stream.metadata", "compaction")),
        ("s3stream/objectformat", ("s3stream.engine", "compaction")),
        ("s3stream/metacopy", ("s3stream.engine", "s3stream.assembly", "compaction")),
    ],
)
def test_imports_point_downward_only(package: str, forbidden: tuple[str, ...]) -> None:
    bad = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for name in _imports_of(path):
            if any(name == f or name.startswith(f + ".") for f in forbidden):
                bad.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not bad, "\n".join(bad)
