"""The Spark source's executor side (``spark_sink.source_read``) over a fake reader: no Spark."""

from __future__ import annotations

import struct

import crc32c
import pytest

import spark_sink.source_read as sr
from s3stream.errors import CorruptionError
from s3stream.ids import StreamId
from s3stream.model import FetchedBatch
from spark_sink.kafka_codec import ATTRIBUTES_OFFSET, CRC_OFFSET, TIMESTAMP_TYPE_MASK, encode_batch
from spark_sink.source_plan import ReadRange


class _Reader:
    """Returns the given batches of stream 7 from the one holding the asked offset on."""

    def __init__(self, batches: list[FetchedBatch]) -> None:
        self.batches = batches

    def fetch(self, stream_id: StreamId, start: int, end: int, max_bytes: int) -> list[FetchedBatch]:
        assert stream_id == 7
        return [b for b in self.batches if b.end_offset > start and b.base_offset < end]


def _batch(base: int, count: int, records: int | None = None, *, append: bool = False) -> FetchedBatch:
    """A fetched batch claiming ``[base, base + count)`` whose payload holds ``records`` records."""
    n = count if records is None else records
    payload = encode_batch([b"k"] * n, [b"%d" % i for i in range(n)], [10 + i for i in range(n)])
    if append:
        struct.pack_into(">h", payload, ATTRIBUTES_OFFSET, TIMESTAMP_TYPE_MASK)
        struct.pack_into(">I", payload, CRC_OFFSET, crc32c.crc32c(bytes(payload[ATTRIBUTES_OFFSET:])))
    return FetchedBatch(base, count, bytes(payload))


def _read(
    monkeypatch: pytest.MonkeyPatch, batches: list[FetchedBatch], start: int, end: int
) -> list[dict[str, object]]:
    monkeypatch.setattr(sr, "shared_reader", lambda key: _Reader(batches))
    rows: list[dict[str, object]] = []
    for rb in sr.read_ranges(("m", None, None), "topic", [ReadRange(3, 7, start, end)]):
        assert rb.schema == sr.SOURCE_SCHEMA
        rows.extend(rb.to_pylist())
    return rows


def test_rows_of_the_ranges_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = _read(monkeypatch, [_batch(0, 4), _batch(4, 3)], 2, 6)
    assert [r["offset"] for r in rows] == [2, 3, 4, 5]
    assert [r["value"] for r in rows] == [b"2", b"3", b"0", b"1"]
    assert {(r["topic"], r["partition"], r["timestampType"]) for r in rows} == {("topic", 3, 0)}


@pytest.mark.parametrize("records", [2, 4], ids=["fewer", "more"])
def test_a_payload_whose_record_count_disagrees_with_its_offsets_is_corruption(
    monkeypatch: pytest.MonkeyPatch, records: int
) -> None:
    """The batch says ``[4, 7)`` but its payload holds 2 or 4 records: never rows at the wrong offsets."""
    batches = [_batch(0, 4), _batch(4, 3, records), _batch(7, 3)]
    with pytest.raises(CorruptionError, match=r"stream 7: batch \[4, 7\) decoded to offsets"):
        _read(monkeypatch, batches, 0, 10)


def test_log_append_time_batches_give_timestamp_type_1(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = _read(monkeypatch, [_batch(0, 2), _batch(2, 2, append=True), _batch(4, 1)], 0, 5)
    assert [r["timestampType"] for r in rows] == [0, 0, 1, 1, 0]
