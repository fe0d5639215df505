"""``s3stream inspect object``: dump one object's footer, index entries and per-block record summaries.

The object is a local file path or an ``s3://bucket/key`` URI. S3 settings come from the environment:
``S3STREAM_S3_ENDPOINT`` (or ``AWS_ENDPOINT_URL``; path-style addressing when set),
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION`` (default ``us-east-1``).

Every byte shown was verified (docs/format.md section 2). A damaged footer, index or checksum
section ends the command with the error and exit code 2; a damaged data block is reported in place
of its records, the other blocks are still shown, and the exit code is 2.

Other ``inspect`` targets plug in as modules ``s3stream/cli/_inspect_<name>.py`` exposing
``register_inspect(subparsers)``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import pkgutil
import stat
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TextIO
from urllib.parse import urlsplit

from s3stream._loop import run
from s3stream.errors import CorruptionError, InvalidArgumentError, NotFoundError
from s3stream.objectformat import IndexEntry, ObjectReader

READ_BATCH_BLOCKS = 64
"""Blocks fetched per round of reads (adjacent ones share a GET)."""


class FileSource:
    """Ranged reads of one local file, behind the reader's RangeSource protocol."""

    def __init__(self, path: str) -> None:
        self.path = path

    def size_bytes(self) -> int:
        try:
            st = os.stat(self.path)
        except FileNotFoundError as exc:
            raise NotFoundError(f"no such file: {self.path}") from exc
        except OSError as exc:
            raise InvalidArgumentError(f"cannot read {self.path}: {exc.strerror}") from exc
        if not stat.S_ISREG(st.st_mode):
            raise InvalidArgumentError(f"{self.path} is not a regular file")
        return st.st_size

    def _read(self, start: int, end: int | None) -> bytes:
        try:
            with open(self.path, "rb") as f:
                f.seek(start)
                return f.read(-1 if end is None else end - start)
        except OSError as exc:
            raise InvalidArgumentError(f"cannot read {self.path}: {exc.strerror}") from exc

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        return await asyncio.to_thread(self._read, start, end)


@dataclass
class BlockDump:
    entry: IndexEntry
    crc32c: int | None
    records: list[dict[str, int]] | None
    error: str | None


async def _open(target: str) -> tuple[ObjectReader, Any]:
    """Open the object; returns the reader and whatever must be closed afterwards (or None)."""
    if target.startswith("s3://"):
        from s3stream.storage.s3 import S3Config, S3ObjectStorage

        try:
            parts = urlsplit(target)
        except ValueError as exc:
            raise InvalidArgumentError(f"expected s3://bucket/key, got {target!r}: {exc}") from exc
        key = parts.path.lstrip("/")
        if not parts.netloc or not key:
            raise InvalidArgumentError(f"expected s3://bucket/key, got {target!r}")
        endpoint = os.environ.get("S3STREAM_S3_ENDPOINT") or os.environ.get("AWS_ENDPOINT_URL") or None
        access_key = os.environ.get("AWS_ACCESS_KEY_ID")
        secret_key = os.environ.get("AWS_SECRET_ACCESS_KEY")
        if access_key is None or secret_key is None:
            access_key = secret_key = None
        storage = S3ObjectStorage(
            S3Config(
                bucket=parts.netloc,
                endpoint=endpoint,
                region=os.environ.get("AWS_REGION", "us-east-1"),
                path_style=endpoint is not None,
                access_key=access_key,
                secret_key=secret_key,
            )
        )
        try:
            size = (await storage.head(key)).size_bytes
            return await ObjectReader.open(storage, key, size), storage
        except BaseException:
            await storage.close()
            raise
    source = FileSource(target)
    return await ObjectReader.open(source, target, source.size_bytes()), None


async def _read_blocks(reader: ObjectReader) -> list[BlockDump]:
    dumps: list[BlockDump] = []
    crcs = reader.block_crcs
    for first in range(0, len(reader.index), READ_BATCH_BLOCKS):
        entries = reader.index[first : first + READ_BATCH_BLOCKS]
        try:
            blocks = await reader.read_blocks(entries)
            results: list[tuple[IndexEntry, list[dict[str, int]] | None, str | None]] = [
                (b.entry, _summaries(b.records), None) for b in blocks
            ]
        except CorruptionError:  # find which blocks: one by one
            results = []
            for entry in entries:
                try:
                    [block] = await reader.read_blocks([entry])
                    results.append((entry, _summaries(block.records), None))
                except CorruptionError as exc:
                    results.append((entry, None, str(exc)))
        for i, (entry, records, error) in enumerate(results):
            crc = crcs[first + i] if crcs is not None else None
            dumps.append(BlockDump(entry, crc, records, error))
    return dumps


def _summaries(records: Sequence[Any]) -> list[dict[str, int]]:
    return [
        {"base_offset": r.base_offset, "count": r.count, "payload_bytes": len(r.payload), "epoch": r.epoch}
        for r in records
    ]


def to_json(reader: ObjectReader, blocks: list[BlockDump] | None) -> dict[str, Any]:
    footer = reader.footer
    index = []
    for i, e in enumerate(reader.index):
        row: dict[str, Any] = {
            "stream_id": e.stream_id,
            "start_offset": e.start_offset,
            "end_offset": e.end_offset,
            "record_count": e.record_count,
            "start_position": e.start_position,
            "size_bytes": e.size_bytes,
        }
        if reader.block_crcs is not None:
            row["crc32c"] = reader.block_crcs[i]
        index.append(row)
    out: dict[str, Any] = {
        "object": reader.key,
        "size_bytes": reader.size_bytes,
        "footer": {
            "index_position": footer.index_position,
            "index_length": footer.index_length,
            "checksum_section_length": footer.checksum_section_length,
            "checksum_section_crc32c": footer.checksum_section_crc if footer.has_checksums else None,
        },
        "has_checksums": reader.has_checksums,
        "index": index,
    }
    if blocks is not None:
        out["blocks"] = [
            {"block": i, "stream_id": b.entry.stream_id, "records": b.records, "error": b.error}
            for i, b in enumerate(blocks)
        ]
    return out


def _table(out: TextIO, columns: Sequence[str], rows: Sequence[Sequence[object]], indent: str = "  ") -> None:
    cells = [[str(v) for v in row] for row in rows]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
    out.write(indent + "  ".join(c.rjust(w) for c, w in zip(columns, widths, strict=True)) + "\n")
    for r in cells:
        out.write(indent + "  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)) + "\n")


def print_text(reader: ObjectReader, blocks: list[BlockDump] | None, out: TextIO) -> None:
    footer = reader.footer
    out.write(f"object {reader.key}: {reader.size_bytes} bytes, {len(reader.index)} data blocks\n")
    out.write(
        f"footer: index position {footer.index_position}, index length {footer.index_length} "
        f"({len(reader.index)} entries), "
    )
    if footer.has_checksums:
        out.write(
            f"checksum section {footer.checksum_section_length} bytes at "
            f"{footer.index_position + footer.index_length} (CRC32C 0x{footer.checksum_section_crc:08x})\n"
        )
    else:
        out.write("no checksum section (AutoMQ object)\n")
    out.write("index:\n")
    columns = ["#", "stream_id", "start_offset", "end_offset", "record_count", "start_position", "size"]
    if reader.block_crcs is not None:
        columns.append("crc32c")
    rows = []
    for i, e in enumerate(reader.index):
        row: list[object] = [i, e.stream_id, e.start_offset, e.end_offset, e.record_count, e.start_position]
        row.append(e.size_bytes)
        if reader.block_crcs is not None:
            row.append(f"{reader.block_crcs[i]:08x}")
        rows.append(row)
    _table(out, columns, rows)
    if blocks is None:
        return
    for i, b in enumerate(blocks):
        e = b.entry
        out.write(
            f"block {i}: stream {e.stream_id} [{e.start_offset}, {e.end_offset}) at {e.start_position}\n"
        )
        if b.error is not None:
            out.write(f"  CORRUPT: {b.error}\n")
            continue
        assert b.records is not None
        _table(
            out,
            ["base_offset", "count", "payload_bytes", "epoch"],
            [[r["base_offset"], r["count"], r["payload_bytes"], r["epoch"]] for r in b.records],
            indent="    ",
        )


async def inspect_object(target: str, *, as_json: bool, records: bool, out: TextIO) -> int:
    reader, closer = await _open(target)
    try:
        blocks = await _read_blocks(reader) if records else None
    finally:
        if closer is not None:
            await closer.close()
    if as_json:
        json.dump(to_json(reader, blocks), out, indent=1)
        out.write("\n")
    else:
        print_text(reader, blocks, out)
    bad = [b for b in blocks or [] if b.error is not None]
    for b in bad:
        print(f"s3stream inspect: error: {b.error}", file=sys.stderr)
    return 2 if bad else 0


def _object_command(args: argparse.Namespace) -> int:
    try:
        return run(
            inspect_object(args.target, as_json=args.json, records=not args.index_only, out=sys.stdout)
        )
    except BrokenPipeError:  # output piped into `head`: stop quietly, as other tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("inspect", help="dump persisted structures (objects, ...)")
    targets = parser.add_subparsers(dest="target_kind", required=True)
    obj = targets.add_parser(
        "object",
        help="footer, index entries and per-block record summaries of one object",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    obj.add_argument("target", help="a file path or s3://bucket/key")
    obj.add_argument("--json", action="store_true", help="print one JSON document")
    obj.add_argument("--index-only", action="store_true", help="skip reading the data blocks")
    obj.set_defaults(func=_object_command)
    package = importlib.import_module("s3stream.cli")
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        if info.name.startswith("_inspect_"):
            importlib.import_module(f"s3stream.cli.{info.name}").register_inspect(targets)
