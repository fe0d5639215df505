"""Hypothesis: the compiled object codecs (s3stream._native) and the pure-Python ones give identical
values for every input and identical errors (type, message, source, position) for every damaged one.

Under ``S3STREAM_PURE_PYTHON=1`` (or where the extension is not built) both sides are the Python
code and these tests pass trivially; ``tests/unit/test_native_build.py`` makes sure CI builds it.
"""

from __future__ import annotations

import asyncio
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from s3stream.errors import S3StreamError
from s3stream.native import NATIVE, compiled_module, pure_python_forced
from s3stream.objectformat import writer as writer_module
from s3stream.objectformat.block import decode_block_gapless, decode_block_gapless_py, encode_block
from s3stream.objectformat.codec import I32_MAX, I64_MAX, IndexEntry
from s3stream.objectformat.decode import decode_data_block, decode_data_block_py
from s3stream.objectformat.writer import ObjectWriter
from s3stream.record import StreamRecordBatch

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def outcome(call: Callable[[], Any]) -> tuple[Any, ...]:
    """What a call gives: its value, or its error's type, message and (for our errors) position."""
    try:
        return ("value", call())
    except (S3StreamError, ValueError, TypeError, OverflowError) as exc:
        return ("error", type(exc), str(exc), getattr(exc, "source", None), getattr(exc, "position", None))


def _check_records(value: tuple[Any, ...]) -> None:
    """Decoded records are real StreamRecordBatch values with bytes payloads (not views)."""
    for record in value[0]:
        assert type(record) is StreamRecordBatch
        assert type(record.payload) is bytes


@st.composite
def one_stream_records(draw: st.DrawFn) -> list[StreamRecordBatch]:
    """One stream's records: alike (the fast paths) or varied, with or without gaps."""
    stream_id = draw(st.sampled_from([0, 7, 2**40, I64_MAX]))
    offset = draw(st.sampled_from([0, 5, 2**40, I64_MAX - 2**33]))
    alike = draw(st.booleans())
    count0 = draw(st.integers(1, 9))
    length0 = draw(st.integers(0, 40))
    epoch0 = draw(st.sampled_from([-(2**63), -1, 0, 3, I64_MAX]))
    records: list[StreamRecordBatch] = []
    for _ in range(draw(st.integers(1, 12))):
        if alike:
            count, length, epoch = count0, length0, epoch0
        else:
            offset += draw(st.sampled_from([0, 0, 1, 9]))
            count = draw(st.sampled_from([0, 1, 3, I32_MAX]))
            length = draw(st.integers(0, 40))
            epoch = draw(st.sampled_from([epoch0, 1]))
        if offset + count > I64_MAX:
            break
        records.append(
            StreamRecordBatch(
                stream_id, epoch, offset, count, draw(st.binary(min_size=length, max_size=length))
            )
        )
        offset += count
    return records or [StreamRecordBatch(stream_id, epoch0, 0, 1, b"x")]


def _entry(records: list[StreamRecordBatch], block: bytes, position: int) -> IndexEntry:
    return IndexEntry(
        records[0].stream_id,
        records[0].base_offset,
        records[-1].end_offset,
        len(records),
        position,
        len(block),
    )


def _damage(draw: st.DrawFn, block: bytes, entry: IndexEntry) -> tuple[bytes, IndexEntry]:
    kind = draw(st.sampled_from(["none", "flip", "set", "truncate", "extend", "entry"]))
    data = bytearray(block)
    if kind == "flip" and data:
        at = draw(st.integers(0, len(data) - 1))
        data[at] ^= draw(st.sampled_from([0x01, 0x80, 0xFF]))
    elif kind == "set" and data:
        # bad magics, lengths, counts: a field's bytes set to an extreme
        at = draw(st.integers(0, len(data) - 1))
        run = draw(st.integers(1, 8))
        data[at : at + run] = bytes([draw(st.sampled_from([0x00, 0x7F, 0x80, 0xFF]))]) * len(
            data[at : at + run]
        )
    elif kind == "truncate":
        del data[draw(st.integers(0, len(data))) :]
    elif kind == "extend":
        data += bytes(draw(st.integers(1, 40)))
    elif kind == "entry":
        field = draw(
            st.sampled_from(["stream_id", "start_offset", "end_offset", "record_count", "size_bytes"])
        )
        delta = draw(st.sampled_from([-1, 1, 33, -(2**40)]))
        values = {
            "stream_id": entry.stream_id,
            "start_offset": entry.start_offset,
            "end_offset": entry.end_offset,
            "record_count": entry.record_count,
            "size_bytes": entry.size_bytes,
        }
        values[field] += delta
        entry = IndexEntry(
            values["stream_id"],
            values["start_offset"],
            values["end_offset"],
            values["record_count"],
            entry.start_position,
            values["size_bytes"],
        )
    return bytes(data), entry


@st.composite
def blocks(draw: st.DrawFn) -> tuple[bytes, IndexEntry, int, str]:
    """A data block (maybe damaged) inside a buffer at ``pos``, its entry and the buffer's type."""
    records = draw(one_stream_records())
    block = encode_block(records)
    pos = draw(st.sampled_from([0, 0, 3]))
    entry = _entry(records, block, 1000 + pos)
    block, entry = _damage(draw, block, entry)
    buf = bytes(pos) + block + bytes(draw(st.sampled_from([0, 0, 5])))
    return buf, entry, pos, draw(st.sampled_from(["bytes", "bytearray", "memoryview"]))


def _as(kind: str, buf: bytes) -> bytes | bytearray | memoryview:
    return {"bytes": buf, "bytearray": bytearray(buf), "memoryview": memoryview(buf)}[kind]


@SETTINGS
@given(blocks())
def test_block_decode_identical_values_and_errors(case: tuple[bytes, IndexEntry, int, str]) -> None:
    buf, entry, pos, kind = case
    python = outcome(lambda: decode_block_gapless_py(_as(kind, buf), pos, entry, source="obj"))
    either = outcome(lambda: decode_block_gapless(_as(kind, buf), pos, entry, source="obj"))
    assert either == python
    if either[0] == "value":
        _check_records(either[1])
    if NATIVE is not None:
        # the compiled decoder itself accepts exactly what the Python one accepts (it is not
        # deferring everything to Python), with the same values
        raw = NATIVE.decode_block(
            _as(kind, buf),
            pos,
            entry.stream_id,
            entry.start_offset,
            entry.end_offset,
            entry.record_count,
            entry.size_bytes,
            False,
        )
        assert (raw is None) == (python[0] == "error")
        if raw is not None:
            assert raw[:2] == python[1]


@SETTINGS
@given(blocks())
def test_data_block_decode_identical_including_the_fast_path_hint(
    case: tuple[bytes, IndexEntry, int, str],
) -> None:
    buf, entry, pos, _ = case
    data = buf[pos : pos + max(entry.size_bytes, 0)]
    python = outcome(lambda: decode_data_block_py(data, entry, source="obj"))
    either = outcome(lambda: decode_data_block(data, entry, source="obj"))
    assert either == python
    if either[0] == "value":
        _check_records(either[1])


def test_block_decode_offsets_past_i64_are_left_to_python() -> None:
    """An entry whose end offset does not fit 64 bits (the format caps it) fails alike."""
    records = [StreamRecordBatch(1, 0, I64_MAX - 1, 1, b"ab")]
    block = encode_block(records)
    entry = IndexEntry(1, I64_MAX - 1, I64_MAX + 5, 1, 0, len(block))
    python = outcome(lambda: decode_block_gapless_py(block, 0, entry, source="obj"))
    assert python[0] == "error"
    assert outcome(lambda: decode_block_gapless(block, 0, entry, source="obj")) == python


def test_block_claiming_more_records_than_fit_fails_alike() -> None:
    """A header and entry agreeing on 2**31 - 1 records in a tiny block: the same error, at once."""
    records = [StreamRecordBatch(1, 0, 0, 1, b"ab")]
    block = bytearray(encode_block(records))
    block[2:6] = I32_MAX.to_bytes(4, "big")
    entry = IndexEntry(1, 0, 1, I32_MAX, 0, len(block))
    python = outcome(lambda: decode_block_gapless_py(bytes(block), 0, entry, source="obj"))
    assert python[0] == "error"
    assert outcome(lambda: decode_block_gapless(bytes(block), 0, entry, source="obj")) == python


# ---------------------------------------------------------------------------------------------
# Encoding: ObjectWriter.write through the compiled runs and through Python


class _Parts:
    """An upload that keeps each part it is handed (the handover points are compared too)."""

    def __init__(self) -> None:
        self.key = "obj"
        self.parts: list[bytes] = []

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        self.parts.append(bytes(data))

    async def copy(self, source_key: str, start: int, end: int) -> None:  # pragma: no cover - unused
        raise NotImplementedError

    async def complete(self) -> int:
        return sum(map(len, self.parts))

    async def abort(self) -> None:
        self.parts.clear()


@st.composite
def writes(draw: st.DrawFn) -> list[list[Any]]:
    """Calls of ``write``: record batches in (stream, offset) order, sometimes a bad one."""
    batches: list[Any] = []
    for stream_id in sorted(draw(st.sets(st.integers(0, 5), min_size=1, max_size=3))):
        offset = draw(st.integers(0, 2**40))
        for _ in range(draw(st.integers(1, 15))):
            offset += draw(st.sampled_from([0, 0, 2]))
            count = draw(st.integers(1, 20))
            payload = draw(st.binary(max_size=draw(st.sampled_from([0, 30, 700]))))
            batches.append(
                StreamRecordBatch(stream_id, draw(st.sampled_from([0, 2])), offset, count, payload)
            )
            offset += count
    if draw(st.integers(0, 4)) == 0:
        at = draw(st.integers(0, len(batches)))
        bad = draw(
            st.sampled_from(
                [
                    StreamRecordBatch(0, 0, 0, 0, b"zero count"),
                    StreamRecordBatch(0, 0, -1, 1, b"negative offset"),
                    StreamRecordBatch(-1, 0, 0, 1, b"negative stream"),
                    StreamRecordBatch(0, 2**63, 0, 1, b"epoch past i64"),
                    StreamRecordBatch(0, 0, I64_MAX, 1, b"end past i64"),
                    StreamRecordBatch(9, 0, 0, I32_MAX + 1, b"count past i32"),
                    StreamRecordBatch(9, 0, 0, 1, bytearray(b"a bytearray payload")),  # type: ignore[arg-type]
                    StreamRecordBatch(9, 0, 0, 1, memoryview(b"a view payload")),  # type: ignore[arg-type]
                    ("not", "a", "batch"),
                ]
            )
        )
        batches.insert(at, bad)
    cuts = sorted(draw(st.lists(st.integers(0, len(batches)), max_size=3)))
    calls, start = [], 0
    for cut in [*cuts, len(batches)]:
        calls.append(batches[start:cut])
        start = cut
    return calls


async def _write(calls: list[list[Any]], block_size: int, handover: int) -> tuple[Any, ...]:
    upload = _Parts()
    writer = ObjectWriter(upload, block_size_bytes=block_size, handover_bytes=handover)  # type: ignore[arg-type]
    results = []
    for call in calls:
        try:
            await writer.write(call)
            results.append(("ok", len(upload.parts)))
        except S3StreamError as exc:
            results.append(("error", type(exc), str(exc)))
    written: tuple[Any, ...]
    try:
        done = await writer.close()
        written = ("value", done.size_bytes, done.index)
    except S3StreamError as exc:
        written = ("error", type(exc), str(exc))
    return tuple(results), written, tuple(upload.parts)


@SETTINGS
@given(writes(), st.sampled_from([1, 40, 700, 1 << 20]), st.sampled_from([1, 100, 5000, 16 << 20]))
def test_writer_identical_bytes_parts_and_errors(
    calls: list[list[Any]], block_size: int, handover: int
) -> None:
    compiled = asyncio.run(_write(calls, block_size, handover))
    saved = writer_module.NATIVE
    writer_module.NATIVE = None
    try:
        python = asyncio.run(_write(calls, block_size, handover))
    finally:
        writer_module.NATIVE = saved
    assert compiled == python


def test_check_batches_accepts_exactly_the_plain_valid_batches() -> None:
    module = compiled_module()
    if module is None:
        assert pure_python_forced(), "s3stream._native is not built"
        return
    good = [StreamRecordBatch(1, 0, 0, 2, b"a"), StreamRecordBatch(1, 0, 2, 1, b"")]
    assert module.check_batches(good, -1, 0, 100)
    assert not module.check_batches(good, 1, 3, 100)  # before the last end offset
    assert not module.check_batches(good, 2, 0, 100)  # a lower stream
    assert not module.check_batches([StreamRecordBatch(1, 0, 0, 1, b"toolong")], -1, 0, 3)
    assert not module.check_batches([StreamRecordBatch(1, 0, 0, 1, bytearray(b"x"))], -1, 0, 3)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# Encoding one stream's columns: ObjectWriter.write_columns / write_streams


@dataclass
class _Columns:
    """A RecordColumns as the LogCache gives it (base offsets in an int64 array, payloads a list)."""

    stream_id: int
    epoch: int | None
    bases: Any
    payloads: Any
    end: int
    epochs: Any = None


@st.composite
def column_streams(draw: st.DrawFn) -> list[_Columns]:
    streams: list[_Columns] = []
    for stream_id in sorted(draw(st.sets(st.integers(0, 6), min_size=1, max_size=4))):
        offset = draw(st.integers(0, 2**40))
        bases, payloads = array("q"), []
        for _ in range(draw(st.integers(1, 15))):
            bases.append(offset)
            payloads.append(draw(st.binary(max_size=draw(st.sampled_from([0, 30, 700])))))
            offset += draw(st.integers(1, 20))
        streams.append(_Columns(stream_id, draw(st.sampled_from([0, 5])), bases, payloads, offset))
    damage = draw(
        st.sampled_from(["none"] * 4 + ["zero_count", "huge_count", "bytearray", "list_bases", "end"])
    )
    target = draw(st.sampled_from(streams))
    at = draw(st.integers(0, len(target.bases) - 1))
    if damage == "zero_count" and at + 1 < len(target.bases):
        target.bases[at + 1] = target.bases[at]
    elif damage == "huge_count":
        target.end += I32_MAX
    elif damage == "bytearray":
        target.payloads[at] = bytearray(b"not bytes")
    elif damage == "list_bases":
        target.bases = list(target.bases)
    elif damage == "end":
        target.end = I64_MAX + 1
    return streams


async def _write_columns(
    streams: list[_Columns], block_size: int, handover: int, whole: bool, cut: int
) -> tuple[Any, ...]:
    upload = _Parts()
    writer = ObjectWriter(upload, block_size_bytes=block_size, handover_bytes=handover)  # type: ignore[arg-type]
    results: list[tuple[Any, ...]] = []
    try:
        if whole:
            await writer.write_streams(streams)  # type: ignore[arg-type]
        else:
            for columns in streams:
                split = min(cut, len(columns.bases))
                await writer.write_columns(columns, 0, split)  # type: ignore[arg-type]
                results.append(("ok", len(upload.parts)))
                await writer.write_columns(columns, split)  # type: ignore[arg-type]
                results.append(("ok", len(upload.parts)))
    except S3StreamError as exc:
        results.append(("error", type(exc), str(exc)))
    written: tuple[Any, ...]
    try:
        done = await writer.close()
        written = ("value", done.size_bytes, done.index)
    except S3StreamError as exc:
        written = ("error", type(exc), str(exc))
    return tuple(results), written, tuple(upload.parts)


@SETTINGS
@given(
    column_streams(),
    st.sampled_from([1, 40, 700, 1 << 20]),
    st.sampled_from([1, 100, 5000, 16 << 20]),
    st.booleans(),
    st.integers(0, 8),
)
def test_writer_columns_identical_bytes_parts_and_errors(
    streams: list[_Columns], block_size: int, handover: int, whole: bool, cut: int
) -> None:
    compiled = asyncio.run(_write_columns(streams, block_size, handover, whole, cut))
    saved = writer_module.NATIVE
    writer_module.NATIVE = None
    try:
        python = asyncio.run(_write_columns(streams, block_size, handover, whole, cut))
    finally:
        writer_module.NATIVE = saved
    assert compiled == python
