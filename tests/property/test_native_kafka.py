"""Hypothesis: the compiled Kafka RecordBatch v2 record loop (s3stream._native.kafka_records) and the
pure-Python one give identical batches for every input and identical errors for every bad one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from s3stream.errors import S3StreamError
from s3stream.native import compiled_module, pure_python_forced
from spark_sink import kafka_codec
from spark_sink.kafka_codec import BATCH_HEADER_SIZE, decode_batch, encode_batch

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

I64_MIN, I64_MAX = -(2**63), 2**63 - 1


def outcome(call: Callable[[], Any]) -> tuple[Any, ...]:
    try:
        return ("value", call())
    except (S3StreamError, ValueError, TypeError, OverflowError, AttributeError, UnicodeError) as exc:
        return ("error", type(exc), str(exc))


def both(*args: Any, **kwargs: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """encode_batch with the compiled loop (where built and in use), then with the Python loop."""
    either = outcome(lambda: encode_batch(*args, **kwargs))
    saved = kafka_codec.NATIVE
    kafka_codec.NATIVE = None
    try:
        python = outcome(lambda: encode_batch(*args, **kwargs))
    finally:
        kafka_codec.NATIVE = saved
    return either, python


blobs = st.one_of(st.none(), st.binary(max_size=40), st.sampled_from([b"x" * 200, b"y" * 20000]))
header_lists = st.one_of(
    st.none(),
    st.just([]),
    st.lists(st.tuples(st.text(max_size=6), st.one_of(st.none(), st.binary(max_size=10))), max_size=3),
)
timestamps = st.one_of(
    st.integers(0, 2**41),
    st.sampled_from([0, -1, 2**40, 70_000, I64_MAX, I64_MIN]),
)


@st.composite
def rows(draw: st.DrawFn) -> tuple[Any, ...]:
    n = draw(st.integers(1, 30))
    keys = draw(st.lists(blobs, min_size=n, max_size=n))
    values = draw(st.lists(blobs, min_size=n, max_size=n))
    ts = draw(st.lists(timestamps, min_size=n, max_size=n))
    headers = draw(st.one_of(st.none(), st.lists(header_lists, min_size=n, max_size=n)))
    return keys, values, ts, headers


@SETTINGS
@given(rows(), st.integers(0, 2**40))
def test_identical_batches_and_errors(case: tuple[Any, ...], base_offset: int) -> None:
    keys, values, ts, headers = case
    either, python = both(keys, values, ts, headers, base_offset=base_offset)
    assert either == python
    if python[0] == "value":
        decoded, _ = decode_batch(bytes(python[1]))
        assert decoded.values == values
        assert decoded.keys == keys


@SETTINGS
@given(rows(), st.data())
def test_inputs_only_python_takes_give_the_same_result(case: tuple[Any, ...], data: st.DataObject) -> None:
    """Tuples, bytearrays, views, str keys, surrogates, bad lengths, an empty batch, floats: the
    compiled loop defers and the result (or error) is the Python one."""
    keys, values, ts, headers = case
    change = data.draw(
        st.sampled_from(
            [
                "tuple",
                "bytearray",
                "view",
                "str_key",
                "surrogate",
                "short_keys",
                "empty",
                "float_ts",
                "huge_ts",
            ]
        )
    )
    if change == "tuple":
        values = tuple(values)
    elif change == "bytearray":
        values = [bytearray(b"v"), *values[1:]]
    elif change == "view":
        keys = [memoryview(b"k"), *keys[1:]]
    elif change == "str_key":
        keys = ["text", *keys[1:]]
    elif change == "surrogate":
        headers = [[("\ud800", b"v")]] + [None] * (len(values) - 1)
    elif change == "short_keys":
        keys = keys[:-1]
    elif change == "empty":
        keys, values, ts, headers = [], [], [], None
    elif change == "float_ts":
        ts = [1.5, *ts[1:]]
    elif change == "huge_ts":
        ts = [*ts[:-1], 2**70]
    either, python = both(keys, values, ts, headers)
    assert either == python


def test_the_compiled_loop_takes_plain_rows() -> None:
    """It does encode plain rows itself (not deferring everything), the same bytes as Python."""
    module = compiled_module()
    if module is None:
        assert pure_python_forced(), "s3stream._native is not built"
        return
    keys = [None, b"k"]
    values = [b"v" * 300, b""]
    ts = [10, 5]
    headers = [[("h", None), ("\u00e9", b"x")], None]
    out = module.kafka_records(keys, values, ts, headers, 10, BATCH_HEADER_SIZE)
    assert out is not None
    saved = kafka_codec.NATIVE
    kafka_codec.NATIVE = None
    try:
        assert bytes(out[BATCH_HEADER_SIZE:]) == bytes(
            encode_batch(keys, values, ts, headers)[BATCH_HEADER_SIZE:]
        )
    finally:
        kafka_codec.NATIVE = saved
    assert module.kafka_records(keys, values, [10, 2**70], headers, 10, BATCH_HEADER_SIZE) is None


# ---------------------------------------------------------------------------------------------
# Decoding: the records loop of decode_batch


def _python_records(
    body: bytes, count: int, base: int, first_ts: int, append_time: int | None
) -> tuple[Any, ...]:
    try:
        return ("value", kafka_codec._decode_records(body, count, base, first_ts, append_time))
    except (kafka_codec._Truncated, ValueError, IndexError, UnicodeDecodeError) as exc:
        return ("error", type(exc), str(exc))


def _varint(n: int) -> bytes:
    return kafka_codec._zigzag_varint(n)


@st.composite
def record_bodies(draw: st.DrawFn) -> tuple[bytes, int]:
    """A records section: well formed, damaged, or built from arbitrary varints and bytes."""
    kind = draw(st.sampled_from(["encoded", "encoded", "damaged", "raw", "overflow"]))
    if kind == "raw":
        body = draw(st.binary(max_size=60))
        return body, draw(st.integers(-1, 8))
    keys, values, _, headers = draw(rows())
    ts = draw(st.lists(st.integers(0, 2**41), min_size=len(values), max_size=len(values)))
    body = bytes(encode_batch(keys, values, ts, headers)[BATCH_HEADER_SIZE:])
    count = len(values)
    if kind == "damaged":
        data = bytearray(body)
        action = draw(st.sampled_from(["flip", "truncate", "extend", "count"]))
        if action == "flip" and data:
            at = draw(st.integers(0, len(data) - 1))
            data[at] = draw(st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0xFF, data[at] ^ 0x40]))
        elif action == "truncate":
            del data[draw(st.integers(0, len(data))) :]
        elif action == "extend":
            data += draw(st.binary(min_size=1, max_size=5))
        else:
            count += draw(st.sampled_from([-1, 1, 2**31]))
        return bytes(data), count
    # varint overflow: an 11-byte varint where a field's varint starts
    field = draw(st.sampled_from(["length", "timestamp", "key"]))
    record = b"\x00" + _varint(0) + _varint(0) + _varint(-1) + _varint(1) + b"v" + _varint(0)
    long_varint = b"\xff" * 10 + b"\x01"
    if field == "length":
        return long_varint + record, 1
    if field == "timestamp":
        inner = b"\x00" + long_varint + _varint(0) + _varint(-1) + _varint(1) + b"v" + _varint(0)
    else:
        inner = b"\x00" + _varint(0) + _varint(0) + long_varint + _varint(1) + b"v" + _varint(0)
    return _varint(len(inner)) + inner, 1


@SETTINGS
@given(
    record_bodies(),
    st.sampled_from([0, 7, 2**40, I64_MAX, I64_MAX + 1]),
    st.sampled_from([0, 1_700_000_000_000, I64_MAX, -5]),
    st.sampled_from([None, None, 1_700_000_000_123]),
)
def test_decoded_records_identical_and_rejected_alike(
    case: tuple[bytes, int], base: int, first_ts: int, append_time: int | None
) -> None:
    body, count = case
    python = _python_records(body, count, base, first_ts, append_time)
    module = compiled_module()
    if module is None:
        assert pure_python_forced(), "s3stream._native is not built"
        return
    compiled = module.kafka_decode_records(body, count, base, first_ts, append_time)
    if python[0] == "error":
        assert compiled is None
    else:
        fits = all(-(2**63) <= v < 2**63 for column in python[1][:2] for v in column)
        assert compiled == (python[1] if fits else None)
        if compiled is not None:
            assert all(type(k) is bytes or k is None for k in compiled[2] + compiled[3])


@SETTINGS
@given(rows(), st.data())
def test_decode_batch_identical_with_and_without_the_compiled_loop(
    case: tuple[Any, ...], data: st.DataObject
) -> None:
    keys, values, ts, headers = case
    either = outcome(lambda: encode_batch(keys, values, ts, headers))
    if either[0] != "value":
        return
    batch = bytearray(either[1])
    if data.draw(st.booleans()) and len(batch) > BATCH_HEADER_SIZE:
        # damage the records, then fix the CRC so the records loop is what finds it
        at = data.draw(st.integers(BATCH_HEADER_SIZE, len(batch) - 1))
        batch[at] ^= data.draw(st.sampled_from([0x01, 0x80, 0xFF]))
        kafka_codec._CRC.pack_into(
            batch,
            kafka_codec.CRC_OFFSET,
            crc32c.crc32c(memoryview(batch)[kafka_codec.ATTRIBUTES_OFFSET :]),
        )
    compiled = outcome(lambda: decode_batch(bytes(batch), source="obj"))
    saved = kafka_codec.NATIVE
    kafka_codec.NATIVE = None
    try:
        python = outcome(lambda: decode_batch(bytes(batch), source="obj"))
    finally:
        kafka_codec.NATIVE = saved
    assert compiled == python
