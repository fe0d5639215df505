"""Hypothesis: encode/decode identity (ours and kafka-python's), arbitrary bytes -> value or CorruptionError."""

from __future__ import annotations

import warnings

from hypothesis import given, settings
from hypothesis import strategies as st

from s3stream.errors import CorruptionError
from spark_sink import kafka_codec as kc

with warnings.catch_warnings():  # kafka-python's import chatter (importlib.resources.read_text)
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.record.default_records import DefaultRecordBatch

_bytes_or_none = st.none() | st.binary(max_size=300)
_header = st.tuples(st.text(max_size=10), _bytes_or_none)
_record = st.tuples(
    _bytes_or_none,
    _bytes_or_none,
    st.integers(min_value=-(1 << 40), max_value=1 << 41),
    st.none() | st.lists(_header, max_size=3),
)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(_record, min_size=1, max_size=40),
    st.integers(min_value=0, max_value=(1 << 62)),
)
def test_round_trip_ours_and_kafka_python(records: list, base_offset: int) -> None:
    keys = [r[0] for r in records]
    values = [r[1] for r in records]
    timestamps = [r[2] for r in records]
    headers = [r[3] for r in records]
    buf = kc.encode_batch(keys, values, timestamps, headers, base_offset=base_offset)
    decoded, end = kc.decode_batch(buf)
    assert end == len(buf)
    assert decoded.keys == keys
    assert decoded.values == values
    assert decoded.timestamps_ms == timestamps
    assert decoded.headers == [list(h or []) for h in headers]
    assert decoded.offsets == [base_offset + i for i in range(len(records))]
    theirs = DefaultRecordBatch(buf)
    assert theirs.validate_crc()
    assert [(r.key, r.value, r.timestamp, r.headers) for r in theirs] == [
        (k, v, t, list(h or [])) for k, v, t, h in zip(keys, values, timestamps, headers, strict=True)
    ]


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=400))
def test_arbitrary_bytes_give_a_batch_or_corruption(data: bytes) -> None:
    try:
        batches = kc.decode_batches(data, source="fuzz")
    except CorruptionError as exc:
        source = exc.source
    else:
        source = "fuzz"
        assert sum(len(b.values) for b in batches) >= 0
    assert source == "fuzz"


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_mutated_batches_give_a_batch_or_corruption(data: st.DataObject) -> None:
    good = bytearray(kc.encode_batch([b"k", None], [b"value", b""], [1, 2], [[("a", b"b")], None]))
    pos = data.draw(st.integers(min_value=0, max_value=len(good) - 1))
    good[pos] = data.draw(st.integers(min_value=0, max_value=255))
    cut = data.draw(st.integers(min_value=0, max_value=len(good)))
    try:
        batches = kc.decode_batches(bytes(good[:cut]))
    except CorruptionError:
        return
    # what decodes must be self-consistent: offsets follow the record count
    for b in batches:
        assert len(b.offsets) == len(b.values) == len(b.keys) == len(b.timestamps_ms)


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=0, max_size=12))
def test_arbitrary_varint_bytes_decode_or_fail_cleanly(data: bytes) -> None:
    try:
        value, end = kc.decode_varint(data, 0)
    except (kc._Truncated, ValueError):
        return
    assert 0 < end <= len(data)
    assert -(1 << 63) <= value < (1 << 63)
