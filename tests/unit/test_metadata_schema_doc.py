"""docs/format.md section 6 against the schema: every table, column, type and NOT NULL, both ways."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

from s3stream.metadata import sqlite_schema

DOC = Path(__file__).resolve().parents[2] / "docs" / "format.md"
MARKER = re.compile(r"<!--\s*sqlite-table:\s*(\w+)\s*-->")


def _documented() -> dict[str, list[tuple[str, str, bool]]]:
    lines = DOC.read_text(encoding="utf-8").splitlines()
    tables: dict[str, list[tuple[str, str, bool]]] = {}
    for i, line in enumerate(lines):
        match = MARKER.search(line)
        if not match:
            continue
        rows = []
        for row in lines[i + 3 :]:
            if not row.startswith("|"):
                break
            cells = [c.strip() for c in row.strip("|").split("|")]
            rows.append((cells[0], cells[1], cells[2] == "no"))
        tables[match.group(1)] = rows
    return tables


def _actual(tmp_path: Path) -> dict[str, list[tuple[str, str, bool]]]:
    conn = sqlite3.connect(tmp_path / "m.db", isolation_level=None)
    sqlite_schema.migrate(conn)
    names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
    tables = {}
    for name in names:
        info = conn.execute(f"PRAGMA table_info({name})").fetchall()
        # a rowid INTEGER PRIMARY KEY is NOT NULL even when not declared so
        tables[name] = [
            (col[1], col[2], bool(col[3]) or (bool(col[5]) and col[2] == "INTEGER")) for col in info
        ]
    conn.close()
    return tables


def test_every_table_is_documented_exactly(tmp_path: Path) -> None:
    documented, actual = _documented(), _actual(tmp_path)
    assert sorted(documented) == sorted(actual)
    for name, columns in actual.items():
        assert documented[name] == columns, name


def test_the_documented_migrations_are_the_code_s() -> None:
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("## 6. Metadata store") :]
    section = re.split(r"^##+ ", section[3:], maxsplit=1, flags=re.MULTILINE)[0]  # up to the next heading
    versions = re.findall(r"^\| (\d+) \| ", section, flags=re.MULTILINE)
    assert [int(v) for v in versions] == list(range(1, sqlite_schema.LATEST_VERSION + 1))
