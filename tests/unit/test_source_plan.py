"""The ``s3stream`` Spark source's pure parts: option checks and offset planning."""

from __future__ import annotations

import re

import pytest

from s3stream.errors import InvalidArgumentError, OffsetOutOfRangeError
from s3stream.ids import StreamId
from spark_sink.protocol import Committed, DiscardedRange
from spark_sink.source_options import EARLIEST, LATEST, parse_options
from spark_sink.source_plan import (
    ReadRange,
    SizedRange,
    TopicSnapshot,
    cap_bytes,
    cap_records,
    offsets_from_json,
    offsets_to_json,
    plan_ranges,
    resolve_offsets,
)

BASE = {"topic": "t", "metadataUrl": "sqlite:///x/metadata.db", "bucketUri": "0@s3://b"}


def _snap(
    *,
    starts: tuple[int, ...] = (0, 0),
    ends: tuple[int, ...] = (100, 50),
    uploaded: tuple[int, ...] | None = None,
) -> TopicSnapshot:
    committed = Committed(ends, "q", 3, (DiscardedRange(0, 40, 45),))
    readable = tuple(min(e, u) for e, u in zip(ends, uploaded or ends, strict=True))
    return TopicSnapshot("t", (StreamId(7), StreamId(9)), starts, readable, committed)


def test_options_defaults_and_case() -> None:
    opts = parse_options({"TOPIC": "t", "metadataurl": "sqlite:///m.db"}, streaming=True)
    assert (opts.topic, opts.metadata_url, opts.bucket_uri, opts.starting, opts.ending) == (
        "t",
        "sqlite:///m.db",
        None,
        "latest",
        "latest",
    )
    assert parse_options(BASE, streaming=False).starting == "earliest"
    opts = parse_options(
        {**BASE, "startingOffsets": '{"t": {"0": 5, "1": -2}}', "maxBytesPerTrigger": "9"}, streaming=True
    )
    assert opts.starting == {0: 5, 1: EARLIEST}
    assert opts.max_bytes_per_trigger == 9


@pytest.mark.parametrize(
    ("options", "streaming", "message"),
    [
        ({"topic": "bad topic"}, True, "option 'topic'"),
        ({"metadataUrl": ""}, True, "option 'metadataUrl' is required"),
        ({"colour": "red"}, True, "unknown option(s) ['colour']"),
        ({"startingOffsets": "{not json"}, True, "startingOffsets must be earliest, latest or JSON"),
        ({"startingOffsets": '{"other": {"0": 1}}'}, True, "must name exactly the topic 't'"),
        ({"maxRecordsPerTrigger": "0"}, True, "maxRecordsPerTrigger must be an int >= 1"),
        ({"startingOffsets": '{"t": {"x": 1}}'}, True, "partition 'x' is not an int"),
        ({"startingOffsets": '{"t": {"0": -3}}'}, True, "offset -3 must be an int >= 0"),
        ({"startingOffsets": '{"t": {"0": true}}'}, True, "offset True"),
        ({"startingOffsets": '{"t": {}}'}, True, "names no partition"),
        ({"startingOffsets": "latest"}, False, "cannot be latest"),
        ({"startingOffsets": '{"t": {"0": -1}}'}, False, "cannot be latest"),
        ({"endingOffsets": "earliest"}, False, "cannot be earliest"),
        ({"maxBytesPerTrigger": "lots"}, True, "maxBytesPerTrigger must be an int >= 1"),
        ({"maxRecordsPerTrigger": "5"}, False, "for streaming reads only"),
    ],
)
def test_bad_options(options: dict[str, str], streaming: bool, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=re.escape(message)):
        parse_options({**BASE, **options}, streaming=streaming)


def test_resolve_offsets() -> None:
    snap = _snap(starts=(10, 0), uploaded=(80, 50))
    assert resolve_offsets("earliest", snap, option="o") == (10, 0)
    assert resolve_offsets("latest", snap, option="o") == (80, 50)  # min(committed, uploaded)
    assert resolve_offsets({0: LATEST, 1: 20}, snap, option="o") == (80, 20)
    with pytest.raises(OffsetOutOfRangeError, match=r"offset 81 is outside the readable \[10, 80\]"):
        resolve_offsets({0: 81, 1: 0}, snap, option="o")
    with pytest.raises(OffsetOutOfRangeError, match="offset 9 is outside"):
        resolve_offsets({0: 9, 1: 0}, snap, option="o")
    with pytest.raises(InvalidArgumentError, match="every partition"):
        resolve_offsets({0: 5}, snap, option="o")


def test_offsets_json_round_trip_and_foreign_checkpoints() -> None:
    obj = offsets_to_json("t", (5, 7))
    assert obj == {"t": {"0": 5, "1": 7}}
    assert offsets_from_json(obj, "t", 2) == (5, 7)
    for bad in (
        {"u": {"0": 5, "1": 7}},
        {"t": {"0": 5}},
        {"t": {"0": 5, "1": -1}},
        {"t": {"0": "5", "1": 1}},
    ):
        with pytest.raises(InvalidArgumentError):
            offsets_from_json(bad, "t", 2)


def test_cap_records_shares_in_proportion_and_always_moves() -> None:
    assert cap_records((0, 0), (100, 50), 1000) == (100, 50)
    assert cap_records((0, 0), (100, 50), 30) == (20, 10)
    assert cap_records((0, 0), (2, 1), 1) == (1, 0)  # floor gives 0 + 0: the remainder keeps it moving
    assert cap_records((10, 5), (10, 5), 3) == (10, 5)
    ends = cap_records((3, 0, 7), (90, 13, 70), 17)
    assert sum(e - s for e, s in zip(ends, (3, 0, 7), strict=True)) == 17


def test_cap_bytes_from_object_sizes() -> None:
    sizes = [[SizedRange(0, 100, 10_000)], [SizedRange(0, 50, 50_000)]]  # 100 vs 1000 bytes a record
    assert cap_bytes((0, 0), (100, 50), sizes, 1 << 20) == (100, 50)
    ends = cap_bytes((0, 0), (100, 50), sizes, 6_000)  # 1/6 of the budget to partition 0, 5/6 to 1
    assert ends == (10, 5)
    assert cap_bytes((0, 0), (100, 50), sizes, 1) == (1, 0)  # never stalls
    # a gap in the sizes: nothing past it
    assert cap_bytes((0,), (100,), [[SizedRange(0, 10, 100)]], 10_000) == (10,)


def test_plan_ranges_skips_discarded_and_refuses_unreadable() -> None:
    snap = _snap(starts=(10, 0))
    assert plan_ranges(snap, (10, 0), (100, 50)) == [
        ReadRange(0, 7, 10, 40),
        ReadRange(0, 7, 45, 100),
        ReadRange(1, 9, 0, 50),
    ]
    assert plan_ranges(snap, (41, 50), (44, 50)) == []  # inside the discarded range
    with pytest.raises(OffsetOutOfRangeError, match="trimmed"):
        plan_ranges(snap, (5, 0), (20, 0))
    with pytest.raises(OffsetOutOfRangeError):
        plan_ranges(snap, (10, 0), (101, 0))
    with pytest.raises(InvalidArgumentError, match="start offset 30 > end offset 20"):
        plan_ranges(snap, (30, 0), (20, 0))


def test_the_options_repr_shows_no_credential() -> None:
    options = parse_options(
        {
            "topic": "t",
            "metadataUrl": "postgresql://u:pg-secret-1@h/db",
            "bucketUri": "0@s3://b?accessKey=a&secretKey=s3-secret-2",
        },
        streaming=True,
    )
    shown = repr(options)
    assert "pg-secret-1" not in shown, shown
    assert "s3-secret-2" not in shown, shown
