"""Test seams stay out of the product: no product module imports ``tests``, names a class for tests,
or reads a crash-test switch from the environment (STYLE.md, Layering: fault-injecting wrappers live
in tests). What tests need is injected: ``UploadObserver``, ``CompactionObserver``, the Spark sink's
``progress_observer``."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.unit.test_engine_layering import imports_of

ROOT = Path(__file__).resolve().parents[2]
PRODUCT_PACKAGES = ("s3stream", "wal", "compaction", "spark_sink", "benchmarks")


def product_files() -> list[Path]:
    return [path for package in PRODUCT_PACKAGES for path in sorted((ROOT / package).rglob("*.py"))]


def test_no_product_module_imports_tests() -> None:
    files = product_files()
    assert any(p.match("spark_sink/sink.py") for p in files)
    offenders = [
        p.relative_to(ROOT).as_posix()
        for p in files
        if any(name == "tests" or name.startswith("tests.") for name in imports_of(p))
    ]
    assert offenders == []


def test_no_product_class_is_a_test_hook() -> None:
    offenders = [
        f"{p.relative_to(ROOT).as_posix()}:{node.name}"
        for p in product_files()
        for node in ast.walk(ast.parse(p.read_text(), str(p)))
        if isinstance(node, ast.ClassDef) and (node.name.startswith("Test") or "Hook" in node.name)
    ]
    assert offenders == []


def test_no_product_module_reads_a_kill_switch() -> None:
    offenders = [p.relative_to(ROOT).as_posix() for p in product_files() if "_KILL" in p.read_text()]
    assert offenders == []
