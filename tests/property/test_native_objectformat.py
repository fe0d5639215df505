"""Hypothesis: the compiled object codecs (s3stream._native) and the pure-Python ones give identical
values for every input and identical errors (type, message, source, position) for every damaged one.

Under ``S3STREAM_PURE_PYTHON=1`` (or where the extension is not built) both sides are the Python
code and these tests pass trivially; ``tests/unit/test_native_build.py`` makes sure CI builds it.
"""

from __future__ import annotations

import asyncio
import struct
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
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


def _padded_block() -> tuple[bytes, IndexEntry]:
    records = [StreamRecordBatch(1, 0, 0, 1, b"abcdefgh" * 3), StreamRecordBatch(1, 0, 1, 1, b"ABCDEFGH" * 3)]
    block = encode_block(records)
    return block + bytes(-len(block) % 8), IndexEntry(1, 0, 2, 2, 0, len(block))


@pytest.mark.parametrize(
    ("kind", "pos"),
    [("int64 items", 0), ("two-dimensional", 0), ("bytes", 2**63), ("bytes", -(2**63) - 1), ("bytes", False)],
)
def test_block_decode_buffers_not_of_bytes_and_huge_positions_fail_alike(kind: str, pos: int) -> None:
    """A view whose len() counts items other than bytes, or a position past int64: the Python
    decoder's outcome (the compiled one takes only byte buffers and int64 positions)."""
    padded, entry = _padded_block()
    buf: bytes | memoryview = {
        "int64 items": memoryview(padded).cast("q"),
        "two-dimensional": memoryview(padded).cast("B", (2, len(padded) // 2)),
        "bytes": padded,
    }[kind]
    python = outcome(lambda: decode_block_gapless_py(buf, pos, entry, source="obj"))
    assert outcome(lambda: decode_block_gapless(buf, pos, entry, source="obj")) == python
    assert python[0] == ("value" if pos is False else "error")
    if NATIVE is not None:
        raw = NATIVE.decode_block(buf, pos, 1, 0, 2, 2, entry.size_bytes, False)
        assert (raw is None) == (python[0] == "error")


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


@pytest.mark.parametrize(
    ("block_bytes", "start_offset", "payload_bytes"),
    [(I64_MAX, 0, 0), (9, 0, 0), (10, -I64_MAX - 1, 0), (10, 0, I64_MAX), (10, 0, -1), (100, 0, 101)],
)
def test_encode_run_refuses_arguments_no_open_block_has(
    block_bytes: int, start_offset: int, payload_bytes: int
) -> None:
    """Sizes and offsets outside an open block's ranges are refused before any sum could overflow."""
    module = compiled_module()
    if module is None:
        assert pure_python_forced(), "s3stream._native is not built"
        return
    batches = [StreamRecordBatch(1, 0, 10, 2, b"x" * 5), StreamRecordBatch(1, 0, 12, 3, b"y" * 7)]
    with pytest.raises(ValueError, match="bad arguments"):
        module.encode_run(bytearray(), batches, 0, 2, 1, block_bytes, start_offset, payload_bytes, 100)


@pytest.mark.parametrize(
    "batch",
    [
        StreamRecordBatch(1, 0, 0, 0, b"x"),
        StreamRecordBatch(1, 0, 0, I32_MAX + 1, b"x"),
        StreamRecordBatch(1, 0, I64_MAX, 1, b"x"),
        StreamRecordBatch(1, 0, -1, 1, b"x"),
    ],
)
def test_encode_run_refuses_a_batch_check_batches_refuses(batch: StreamRecordBatch) -> None:
    """encode_run re-checks what its sums and 32-bit fields rely on instead of truncating a count."""
    module = compiled_module()
    if module is None:
        assert pure_python_forced(), "s3stream._native is not built"
        return
    assert not module.check_batches([batch], -1, 0, 100)
    with pytest.raises(ValueError, match="check_batches did not accept"):
        module.encode_run(bytearray(), [batch], 0, 1, 1, 10, 0, 0, 100)


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


# what a writer raises for bad columns (the Python loop's own errors included)
_COLUMN_ERRORS = (S3StreamError, ValueError, TypeError, OverflowError, struct.error)


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
    except _COLUMN_ERRORS as exc:
        results.append(("error", type(exc), str(exc)))
    written: tuple[Any, ...]
    try:
        done = await writer.close()
        written = ("value", done.size_bytes, done.index)
    except _COLUMN_ERRORS as exc:
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


def _columns_both(streams: Callable[[], list[_Columns]], whole: bool) -> tuple[Any, Any]:
    compiled = asyncio.run(_write_columns(streams(), 1 << 20, 16 << 20, whole, 8))
    saved = writer_module.NATIVE
    writer_module.NATIVE = None
    try:
        python = asyncio.run(_write_columns(streams(), 1 << 20, 16 << 20, whole, 8))
    finally:
        writer_module.NATIVE = saved
    return compiled, python


@pytest.mark.parametrize("whole", [True, False])
@pytest.mark.parametrize(
    "streams",
    [
        pytest.param(lambda: [_Columns(1, 0, [2**64], [b"x"], 5)], id="list bases, first past int64"),
        pytest.param(
            lambda: [_Columns(1, 0, [2**63 + 5], [b"x"], 2**63 + 6)], id="list bases, all past int64"
        ),
        pytest.param(lambda: [_Columns(1, 0, [0.0, 1.0], [b"a", b"b"], 2)], id="list bases of floats"),
        pytest.param(lambda: [_Columns(1, 0, array("q", [0, 1]), [b"a", b"b", b"c"], 2)], id="more payloads"),
        pytest.param(lambda: [_Columns(1, 0, array("q", [0, 1, 2]), [b"a", b"b"], 3)], id="fewer payloads"),
    ],
)
def test_writer_columns_python_rejects_fail_alike(streams: Callable[[], list[_Columns]], whole: bool) -> None:
    """Columns the Python loop refuses (and then closes the writer, or not) give the same errors,
    bytes and writer state through the compiled run."""
    compiled, python = _columns_both(streams, whole)
    assert python[0][-1][0] == "error"
    assert compiled == python


def test_columns_run_reads_unaligned_bases() -> None:
    """Base offsets in a view that starts off an 8-byte boundary encode as from an aligned array
    (the run copies each one out rather than loading it through a misaligned pointer)."""
    module = compiled_module()
    if module is None:
        assert pure_python_forced(), "s3stream._native is not built"
        return
    raw = bytearray(8 * 3 + 1)
    unaligned = memoryview(raw)[1:].cast("q")
    unaligned[0], unaligned[1], unaligned[2] = 7, 9, 12
    aligned = array("q", [7, 9, 12])
    payloads = [b"a", b"bc", b"def"]

    def run(bases: Any) -> tuple[Any, bytes]:
        scratch = bytearray()
        result = module.encode_columns_run(scratch, bases, payloads, 15, 0, 3, 1, 0, 10, 7, 0, 100, 1000)
        return result, bytes(scratch[: result[0]])

    assert run(unaligned) == run(aligned)
    assert run(aligned)[0] == (3 * 33 + 6, 3, 6, 15, False)


@pytest.mark.parametrize(
    ("bases", "payloads", "block_bytes", "start_offset", "payload_bytes"),
    [
        pytest.param(array("q", [0, 1, 2]), [b"a", b"b", b"c", b"d"], 10, 0, 0, id="more payloads"),
        pytest.param(array("q", [0, 1, 2]), [b"a", b"b", b"c"], I64_MAX, 0, 0, id="block bytes past a block"),
        pytest.param(array("q", [0, 1, 2]), [b"a", b"b", b"c"], 10, -I64_MAX, 0, id="negative start"),
        pytest.param(array("q", [0, 1, 2]), [b"a", b"b", b"c"], 10, 2**64, 0, id="start past int64"),
        pytest.param(
            array("q", [0, 1, 2]), [b"a", b"b", b"c"], 10, 0, I64_MAX, id="payload bytes past block"
        ),
    ],
)
def test_columns_run_defers_inputs_it_does_not_take(
    bases: Any, payloads: list[bytes], block_bytes: int, start_offset: int, payload_bytes: int
) -> None:
    """The run encodes nothing and hands record i to the Python loop (deferred) for these."""
    module = compiled_module()
    if module is None:
        assert pure_python_forced(), "s3stream._native is not built"
        return
    result = module.encode_columns_run(
        bytearray(), bases, payloads, 3, 0, 3, 1, 0, block_bytes, start_offset, payload_bytes, 100, 1000
    )
    assert result == (0, 0, payload_bytes, -1, True)
