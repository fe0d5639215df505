"""Layering: exactly one assembly module, and nothing below it imports it (STYLE.md, Layering)."""

from __future__ import annotations

import ast
from pathlib import Path

import s3stream
from s3stream import assembly, facade

ROOT = Path(__file__).resolve().parents[2]
ABOVE_ASSEMBLY = {"s3stream/__init__.py", "s3stream/assembly.py"}
"""The package front door re-exports the assembly; the CLI (s3stream/cli/) sits above it too."""


def imports_of(path: Path) -> set[str]:
    """Every module name ``path`` imports, at any depth (function-local imports included)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def below_assembly() -> list[Path]:
    files = []
    for package in ("s3stream", "compaction", "wal"):
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if relative in ABOVE_ASSEMBLY or relative.startswith("s3stream/cli/"):
                continue
            files.append(path)
    return files


def test_nothing_below_the_assembly_imports_it() -> None:
    files = below_assembly()
    assert any(p.match("s3stream/engine/client.py") for p in files)
    offenders = [p.relative_to(ROOT).as_posix() for p in files if "s3stream.assembly" in imports_of(p)]
    assert offenders == []


def test_the_front_door_opens_through_the_assembly() -> None:
    assert s3stream.open is assembly.open_client
    assert s3stream.open_sync is assembly.open_sync
    assert not hasattr(s3stream.Client, "open")
    assert not hasattr(facade, "open_sync")
