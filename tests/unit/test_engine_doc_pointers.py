"""Docstrings that cite a docs/format.md section cite the section that holds their structure."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def section_number(title_prefix: str) -> int:
    headings = re.findall(r"^## (\d+)\. (.+)$", (ROOT / "docs/format.md").read_text(), re.MULTILINE)
    matches = [int(number) for number, title in headings if title.startswith(title_prefix)]
    assert len(matches) == 1, headings
    return matches[0]


@pytest.mark.parametrize(
    ("module", "title_prefix"),
    [
        ("s3stream/metadata/sqlite_schema.py", "Metadata store"),
        ("s3stream/metadata/__init__.py", "Metadata store"),
        ("s3stream/storage/local.py", "Local object store"),
    ],
)
def test_module_docstring_cites_its_format_section(module: str, title_prefix: str) -> None:
    text = (ROOT / module).read_text()
    cited = {int(n) for n in re.findall(r"docs/format\.md`{0,2} section (\d+)", text)}
    assert cited == {section_number(title_prefix)}
