"""Bulk decoding of Kafka batches into Arrow (``spark_sink.kafka_arrow``) against the per-record decoder."""

from __future__ import annotations

import re
import struct
import tracemalloc
from typing import Any

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from s3stream.errors import CorruptionError
from spark_sink.kafka_arrow import RECORDS_SCHEMA, decode_batch_arrow
from spark_sink.kafka_codec import (
    ATTRIBUTES_OFFSET,
    BATCH_HEADER,
    BATCH_HEADER_SIZE,
    CRC_OFFSET,
    LENGTH_FIELD_END,
    decode_batch,
    encode_batch,
)

_KEYS = st.none() | st.binary(max_size=40) | st.sampled_from([b"k" * 200, b"k" * 20000])
_VALUES = st.none() | st.binary(max_size=300) | st.sampled_from([b"v" * 1024, b"v" * 70000])
_HEADERS = st.lists(st.tuples(st.text(max_size=5), st.none() | st.binary(max_size=5)), max_size=2)


def _expected(buf: bytes, base: int, lo: int, hi: int) -> list[dict[str, Any]]:
    d, _ = decode_batch(buf, source="t", base_offset=base)
    return [
        {
            "key": k,
            "value": v,
            "offset": o,
            "timestamp_us": t * 1000,
            "headers": [{"key": a, "value": b} for a, b in h],
        }
        for o, t, k, v, h in zip(d.offsets, d.timestamps_ms, d.keys, d.values, d.headers, strict=True)
        if lo <= o < hi
    ]


def _got(rb: Any) -> list[dict[str, Any]]:
    assert rb.schema == RECORDS_SCHEMA
    ts = rb.column(3).cast("int64").to_pylist()
    return [
        {
            "key": r["key"],
            "value": r["value"],
            "offset": r["offset"],
            "timestamp_us": t,
            "headers": r["headers"],
        }
        for r, t in zip(rb.to_pylist(), ts, strict=True)
    ]


@settings(max_examples=100, deadline=None)
@given(
    records=st.lists(st.tuples(_KEYS, _VALUES, st.integers(0, 1 << 42), _HEADERS), min_size=1, max_size=30),
    with_headers=st.booleans(),
    base=st.integers(0, 1 << 40),
    cut=st.tuples(st.integers(-2, 32), st.integers(-2, 32)),
)
def test_same_rows_as_decode_batch(
    records: list[tuple[Any, Any, int, Any]], with_headers: bool, base: int, cut: tuple[int, int]
) -> None:
    keys, values, ts, headers = (list(c) for c in zip(*records, strict=True))
    buf = bytes(encode_batch(keys, values, ts, headers if with_headers else None))
    lo, hi = base + min(cut), base + max(cut)
    rb = decode_batch_arrow(buf, source="t", base_offset=base, start_offset=lo, end_offset=hi)
    assert _got(rb) == _expected(buf, base, lo, hi)


def _refresh_crc(buf: bytearray) -> None:
    struct.pack_into(">I", buf, CRC_OFFSET, crc32c.crc32c(bytes(buf[ATTRIBUTES_OFFSET:])))


@settings(max_examples=150, deadline=None)
@given(
    data=st.data(),
    count=st.integers(1, 8),
    fix_crc=st.booleans(),
)
def test_bad_bytes_fail_as_decode_batch_does(data: st.DataObject, count: int, fix_crc: bool) -> None:
    """Damaged records (the CRC recomputed, so the record checks decide) give the per-record
    decoder's CorruptionError, or, where they still parse, its rows."""
    buf = bytearray(encode_batch([b"k"] * count, [b"v" * 200] * count, list(range(count))))
    pos = data.draw(st.integers(BATCH_HEADER_SIZE, len(buf) - 1))
    buf[pos] = data.draw(st.integers(0, 255))
    if fix_crc:
        _refresh_crc(buf)
    message: str | None = None
    expected: list[dict[str, Any]] = []
    try:
        expected = _expected(bytes(buf), 0, 0, 1 << 62)
    except CorruptionError as exc:
        message = str(exc)
    if message is not None:
        with pytest.raises(CorruptionError) as got:
            decode_batch_arrow(bytes(buf), source="t", base_offset=0, start_offset=0, end_offset=1 << 62)
        assert str(got.value) == message
        return
    rb = decode_batch_arrow(bytes(buf), source="t", base_offset=0, start_offset=0, end_offset=1 << 62)
    assert _got(rb) == expected


@settings(max_examples=50, deadline=None)
@given(
    count=st.integers(2, 40),
    key_size=st.sampled_from([0, 16, 200]),
    value_size=st.sampled_from([1, 100, 1024, 20000]),
    odd=st.none() | st.tuples(st.integers(0, 39), st.sampled_from([-1, 1, 128])),
)
def test_fixed_size_records_and_one_odd_record(
    count: int, key_size: int, value_size: int, odd: tuple[int, int] | None
) -> None:
    """Records of one size take the no-loop bounds; one record of another size must not fool it."""
    values = [b"v" * value_size for _ in range(count)]
    if odd is not None:
        values[odd[0] % count] = b"w" * max(0, value_size + odd[1])
    buf = bytes(encode_batch([b"k" * key_size] * count, values, list(range(count))))
    rb = decode_batch_arrow(buf, source="t", base_offset=5, start_offset=0, end_offset=1 << 40)
    assert _got(rb) == _expected(buf, 5, 0, 1 << 40)


def test_trailing_bytes_and_truncation() -> None:
    buf = bytes(encode_batch([b"k"], [b"v"], [1]))
    with pytest.raises(CorruptionError, match="bytes after the Kafka batch"):
        decode_batch_arrow(buf + b"\0", source="t", base_offset=0, start_offset=0, end_offset=9)
    with pytest.raises(CorruptionError):
        decode_batch_arrow(buf[:-1], source="t", base_offset=0, start_offset=0, end_offset=9)


def test_a_1kib_batch_takes_the_bulk_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bulk path (no per-record decode) is the one the source's rows take: decode_batch is not called."""
    import spark_sink.kafka_arrow as ka

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the per-record decoder ran")

    monkeypatch.setattr(ka, "decode_batch", refuse)
    buf = bytes(encode_batch([b"%d" % i for i in range(500)], [b"x" * 1024] * 500, [7] * 500))
    rb = decode_batch_arrow(buf, source="t", base_offset=10, start_offset=0, end_offset=1 << 40)
    assert rb.num_rows == 500
    assert rb.column(2).to_pylist() == list(range(10, 510))
    assert rb.column(1).to_pylist() == [b"x" * 1024] * 500


def _forge(body: bytes, count: int) -> bytes:
    """A batch with a valid CRC whose header claims ``count`` records over ``body``."""
    buf = bytearray(BATCH_HEADER_SIZE) + body
    BATCH_HEADER.pack_into(
        buf, 0, 0, len(buf) - LENGTH_FIELD_END, -1, 2, 0, 0, count - 1, 0, 0, -1, -1, -1, count
    )
    _refresh_crc(buf)
    return bytes(buf)


def _peak_bytes(fn: Any) -> int:
    """The most bytes allocated at once while ``fn()`` runs (its exceptions swallowed)."""
    tracemalloc.start()
    try:
        fn()
    except CorruptionError:
        pass
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak


@pytest.mark.parametrize("first", [b"\x01", b"\x03"])
def test_a_huge_count_over_a_tiny_body_is_refused_without_a_step_per_record(first: bytes) -> None:
    """Record length -1 or -2 (the walk would stay on, or step back to, that byte) and 2,000,000
    records claimed over 14 bytes: the per-record decoder's CorruptionError, with no per-claimed-record work or memory."""
    buf = _forge(first + bytes(13), 2_000_000)
    with pytest.raises(CorruptionError) as want:
        decode_batch(buf, source="t", base_offset=0)
    with pytest.raises(CorruptionError) as got:
        decode_batch_arrow(buf, source="t", base_offset=0, start_offset=0, end_offset=1 << 62)
    assert str(got.value) == str(want.value)
    peak = _peak_bytes(
        lambda: decode_batch_arrow(buf, source="t", base_offset=0, start_offset=0, end_offset=1 << 62)
    )
    assert peak < 1 << 20


def test_a_record_length_below_the_minimum_stops_the_bounds_walk_at_once() -> None:
    """A count the body could hold, but the first length is -1 (the walk would stay on that byte)."""
    from spark_sink.kafka_arrow import RECORD_MIN_BYTES, _record_bounds

    count = 300_000
    body = b"\x01" + bytes(count * RECORD_MIN_BYTES - 1)
    assert _record_bounds(body, count) is None
    assert _peak_bytes(lambda: _record_bounds(body, count)) < 1 << 20


def test_records_of_the_minimum_size_still_take_the_bulk_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Null key, null value, no headers, one-byte deltas: 7 bytes a record, which the count check allows."""
    import spark_sink.kafka_arrow as ka

    buf = bytes(encode_batch([None] * 3, [None] * 3, [0] * 3))
    assert len(buf) - BATCH_HEADER_SIZE == 3 * ka.RECORD_MIN_BYTES
    monkeypatch.setattr(ka, "decode_batch", None)
    rb = decode_batch_arrow(buf, source="t", base_offset=4, start_offset=0, end_offset=9)
    assert rb.column(2).to_pylist() == [4, 5, 6]
    assert rb.column(1).null_count == 3


def _log_append_time(buf: bytearray, max_ts: int) -> bytearray:
    """``buf`` with the log-append-time attribute set and the max timestamp ``max_ts`` (CRC redone)."""
    struct.pack_into(">h", buf, ATTRIBUTES_OFFSET, struct.unpack_from(">h", buf, ATTRIBUTES_OFFSET)[0] | 0x08)
    struct.pack_into(">q", buf, ATTRIBUTES_OFFSET + 2 + 4 + 8, max_ts)
    _refresh_crc(buf)
    return buf


@pytest.mark.parametrize(
    ("base", "timestamps", "append_max_ts", "what"),
    [
        ((1 << 63) - 2, [0, 0, 0], None, "offset 9223372036854775808 "),
        (-(1 << 63), [0, 0], None, None),  # the least int64 offset is fine
        (0, [0, 1 << 62], None, "timestamp (ms) 4611686018427387904 "),
        (0, [5, -(1 << 62)], None, "timestamp (ms) -4611686018427387904 "),
        (0, [0, 0], 1 << 62, "timestamp (ms) 4611686018427387904 "),
        (0, [0, 0], (1 << 63) // 1000, None),  # the largest timestamp the column holds
    ],
)
def test_offsets_and_timestamps_out_of_int64_fail_alike_in_both_paths(
    base: int, timestamps: list[int], append_max_ts: int | None, what: str | None
) -> None:
    """The bulk path's int64 arithmetic must not wrap, and the per-record path (taken for records
    with headers) must not leak OverflowError: both give the same CorruptionError."""
    n = len(timestamps)
    messages = []
    for headers in (None, [[("h", b"x")]] * n):
        buf = encode_batch([b"k"] * n, [b"v"] * n, timestamps, headers)
        if append_max_ts is not None:
            buf = _log_append_time(buf, append_max_ts)
        if what is None:
            rb = decode_batch_arrow(
                bytes(buf), source="t", base_offset=base, start_offset=-(1 << 63), end_offset=1 << 62
            )
            assert rb.column(2).to_pylist() == list(range(base, base + n))
            continue
        with pytest.raises(CorruptionError, match=re.escape(what)) as got:
            decode_batch_arrow(bytes(buf), source="t", base_offset=base, start_offset=0, end_offset=1 << 62)
        messages.append(str(got.value))
    assert len(set(messages)) <= 1


@pytest.mark.parametrize("headers", [None, [[("h", b"x")]] * 3], ids=["bulk", "per-record"])
@pytest.mark.parametrize("append", [False, True], ids=["create-time", "log-append-time"])
def test_the_batch_timestamp_type_is_every_row_s(headers: Any, append: bool) -> None:
    buf = encode_batch([b"k"] * 3, [b"v"] * 3, [1, 2, 3], headers)
    if append:
        buf = _log_append_time(buf, 99)
    rb = decode_batch_arrow(bytes(buf), source="t", base_offset=0, start_offset=1, end_offset=9)
    assert rb.column("timestamp_type").to_pylist() == [1 if append else 0] * 2
    assert rb.column("timestamp").cast("int64").to_pylist() == ([99_000] * 2 if append else [2000, 3000])
