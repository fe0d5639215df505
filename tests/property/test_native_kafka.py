"""Hypothesis: the compiled Kafka RecordBatch v2 record loop (s3stream._native.kafka_records) and the
pure-Python one give identical batches for every input and identical errors for every bad one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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
