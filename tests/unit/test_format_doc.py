"""docs/format.md against the code: every struct table matches its ``struct.Struct``, examples match bytes.

Extending it (the WAL and any later format):
- put ``<!-- struct: package.module:NAME -->`` on the line before a table with columns
  ``Off | Size | Type | Field | ...``; the table is checked against that ``struct.Struct``;
- every public (not ``_``-prefixed) module-level ``struct.Struct`` of a module named in a marker or
  listed in ``DOCUMENTED_MODULES`` must have a table;
- put ``<!-- example: NAME -->`` before a fenced hex dump (``pos hex bytes... | what``) and add
  ``NAME: (module, attribute)`` to ``EXAMPLES``, naming the golden bytes a unit test checks.
"""

from __future__ import annotations

import ast
import importlib
import re
import struct
from dataclasses import dataclass
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "format.md"

DOCUMENTED_MODULES: list[str] = ["s3stream.record", "s3stream.objectformat.codec", "wal.format"]
EXAMPLES: dict[str, tuple[str, str]] = {
    "automq-object": ("tests.unit.test_objectformat", "AUTOMQ_OBJECT"),
    "s3stream-object": ("tests.unit.test_objectformat", "OBJECT"),
    "wal-record": ("tests.unit.test_wal_format", "GOLDEN_RECORD"),
    "wal-header": ("tests.unit.test_wal_format", "GOLDEN_HEADER"),
}

TYPE_CODES = {"i8": "b", "u8": "B", "i16": "h", "u16": "H", "i32": "i", "u32": "I", "i64": "q", "u64": "Q"}
STRUCT_MARKER = re.compile(r"<!--\s*struct:\s*([\w.]+):(\w+)\s*-->")
EXAMPLE_MARKER = re.compile(r"<!--\s*example:\s*([\w.\-]+)\s*-->")


@dataclass(frozen=True)
class Row:
    offset: str
    size: str
    type: str
    field: str


@dataclass(frozen=True)
class DocTable:
    module: str
    name: str
    line: int
    rows: tuple[Row, ...]


def _doc_lines() -> list[str]:
    return DOC.read_text(encoding="utf-8").splitlines()


def _table_after(lines: list[str], start: int) -> list[list[str]]:
    """The rows (header and separator dropped) of the first markdown table after line ``start``."""
    i = start + 1
    while i < len(lines) and not lines[i].lstrip().startswith("|"):
        assert not lines[i].strip() or lines[i].startswith("<!--"), (
            f"text between marker and table at line {i + 1}"
        )
        i += 1
    rows = []
    while i < len(lines) and lines[i].lstrip().startswith("|"):
        rows.append([cell.strip() for cell in lines[i].strip().strip("|").split("|")])
        i += 1
    assert len(rows) >= 3, f"no table after the marker at line {start + 1}"
    header = [cell.lower() for cell in rows[0]]
    assert header[:4] == ["off", "size", "type", "field"], f"table at line {start + 2}: columns {rows[0]}"
    return rows[2:]


def doc_tables() -> list[DocTable]:
    lines = _doc_lines()
    tables = []
    for n, line in enumerate(lines):
        m = STRUCT_MARKER.fullmatch(line.strip())
        if m:
            rows = tuple(Row(*cells[:4]) for cells in _table_after(lines, n))
            tables.append(DocTable(m.group(1), m.group(2), n + 1, rows))
    return tables


def expand_format(fmt: str) -> tuple[str, list[str]]:
    """Byte-order prefix and one code per byte-width item (``"8x"`` -> eight ``"x"``)."""
    order, body = (fmt[0], fmt[1:]) if fmt[:1] in "<>!=@" else ("@", fmt)
    codes: list[str] = []
    for count, code in re.findall(r"(\d*)([a-zA-Z?])", body):
        codes.extend([code] * (int(count) if count else 1))
    return order, codes


def codes_of_rows(table: DocTable) -> list[str]:
    """Struct codes the table describes (its fixed part), checking offsets and sizes on the way."""
    codes: list[str] = []
    position = 0
    variable_seen = False
    for row in table.rows:
        where = f"docs/format.md line {table.line}, field {row.field!r}"
        assert row.offset.isdigit(), f"{where}: offset {row.offset!r} is not a number"
        assert int(row.offset) == position, f"{where}: offset {row.offset} != {position}"
        if not row.size.isdigit():
            variable_seen = True  # variable-length data follows the struct
            continue
        assert not variable_seen, f"{where}: fixed field after a variable-length one"
        size = int(row.size)
        if row.type == "zero":
            codes.extend(["x"] * size)
        else:
            assert row.type in TYPE_CODES, f"{where}: unknown type {row.type!r}"
            code = TYPE_CODES[row.type]
            assert struct.calcsize(">" + code) == size, f"{where}: {row.type} is not {size} bytes"
            codes.append(code)
        position += size
    return codes


TABLES = doc_tables()


def test_the_document_has_struct_tables() -> None:
    assert len(TABLES) >= 6


@pytest.mark.parametrize("table", TABLES, ids=lambda t: f"{t.module}:{t.name}")
def test_table_matches_struct(table: DocTable) -> None:
    obj = getattr(importlib.import_module(table.module), table.name)
    assert isinstance(obj, struct.Struct), f"{table.module}:{table.name} is not a struct.Struct"
    order, codes = expand_format(obj.format)
    assert order == ">", f"{table.name}: docs/format.md states big-endian for every structure"
    assert codes_of_rows(table) == codes, (
        f"docs/format.md line {table.line} disagrees with {table.name}.format"
    )
    fixed = sum(int(r.size) for r in table.rows if r.size.isdigit())
    assert fixed == obj.size


def _structs_defined_in(path: str) -> set[str]:
    """Names assigned ``struct.Struct(...)`` at the top level of a module (imports excluded)."""
    names: set[str] = set()
    for node in ast.parse(Path(path).read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            func = node.value.func
            if isinstance(func, ast.Attribute) and func.attr == "Struct":
                names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def documented_modules() -> list[str]:
    return sorted(set(DOCUMENTED_MODULES) | {t.module for t in TABLES})


@pytest.mark.parametrize("module_name", documented_modules())
def test_every_public_struct_of_a_codec_module_is_documented(module_name: str) -> None:
    module = importlib.import_module(module_name)
    structs = {name for name in _structs_defined_in(module.__file__ or "") if not name.startswith("_")}
    assert all(isinstance(getattr(module, name), struct.Struct) for name in structs)
    documented = {t.name for t in TABLES if t.module == module_name}
    assert structs - documented == set(), f"undocumented structs in {module_name}"
    assert documented - structs == set(), f"docs/format.md names structs {module_name} does not have"


def doc_examples() -> dict[str, tuple[int, bytes]]:
    """Every example dump: name -> (line, bytes), checking each line's position column on the way."""
    lines = _doc_lines()
    out: dict[str, tuple[int, bytes]] = {}
    for n, line in enumerate(lines):
        m = EXAMPLE_MARKER.fullmatch(line.strip())
        if not m:
            continue
        assert lines[n + 1].startswith("```"), f"docs/format.md line {n + 2}: example must be a fenced block"
        data = bytearray()
        i = n + 3  # skip the fence and the column header
        while not lines[i].startswith("```"):
            tokens = lines[i].split("|")[0].split()
            pos_dec, pos_hex, groups = int(tokens[0]), int(tokens[1], 16), tokens[2:]
            assert pos_dec == pos_hex == len(data), (
                f"docs/format.md line {i + 1}: position {pos_dec} != {len(data)}"
            )
            data += bytes.fromhex("".join(groups))
            i += 1
        out[m.group(1)] = (n + 1, bytes(data))
    return out


def test_every_example_is_registered() -> None:
    assert set(doc_examples()) == set(EXAMPLES)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_dump_is_the_golden_bytes(name: str) -> None:
    module_name, attribute = EXAMPLES[name]
    golden = getattr(importlib.import_module(module_name), attribute)
    line, dumped = doc_examples()[name]
    assert dumped == golden, (
        f"docs/format.md example {name!r} (line {line}) differs from {module_name}.{attribute}"
    )


def test_checker_catches_a_wrong_table() -> None:
    """The checker itself can fail: a swapped field type is reported."""
    table = next(t for t in TABLES if t.name == "INDEX_ENTRY")
    rows = list(table.rows)
    rows[2] = Row(rows[2].offset, rows[2].size, "u32", rows[2].field)
    bad = DocTable(table.module, table.name, table.line, tuple(rows))
    _, codes = expand_format(importlib.import_module(table.module).INDEX_ENTRY.format)
    assert codes_of_rows(bad) != codes
    rows[2] = Row("17", rows[2].size, "i32", rows[2].field)
    with pytest.raises(AssertionError, match="offset"):
        codes_of_rows(DocTable(table.module, table.name, table.line, tuple(rows)))
