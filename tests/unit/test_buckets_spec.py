"""Parsing ``s3.data.buckets`` and ``s3.data.buckets.weights``, and the config keys that carry them."""

from __future__ import annotations

import pytest

from s3stream.buckets.spec import format_weights, is_bucket_list, parse_bucket_list, parse_weights
from s3stream.config import Config
from s3stream.errors import InvalidArgumentError

A = "s3://a?region=us-east-1&endpoint=http://127.0.0.1:7480&pathStyle=true"
B = "s3://b?region=us-east-1&endpoint=http://127.0.0.1:7481&secretKey=hunter2"


def test_a_list_keeps_its_ids_and_order() -> None:
    entries = parse_bucket_list(f"3@{A},1@{B}")
    assert [(e.bucket_id, e.protocol) for e in entries] == [(3, "s3"), (1, "s3")]
    assert entries[1].uri == f"1@{B}"
    assert is_bucket_list(f"3@{A},1@{B}")
    assert not is_bucket_list(f"0@{A}")
    assert not is_bucket_list(A)


def test_a_lone_entry_may_omit_its_id() -> None:
    (entry,) = parse_bucket_list(A)
    assert entry.bucket_id == 0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (f"0@{A},{B}", "stable id"),
        (f"0@{A},0@{B}", "given twice"),
        (f"0@{A},1@mem://x", "must all be s3"),
        (f"0@{A},,1@{B}", "empty"),
        (f"0@{A},1@ftp://x", "protocol"),
        ("", "empty"),
    ],
)
def test_bad_lists_are_refused_naming_the_entry(text: str, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message) as info:
        parse_bucket_list(text)
    assert "hunter2" not in str(info.value)


def test_a_percent_encoded_comma_stays_inside_its_value() -> None:
    entries = parse_bucket_list("0@s3://a?region=x&prefix=p%2Cq,1@s3://b?region=x")
    assert [e.bucket_id for e in entries] == [0, 1]


def test_mem_and_file_entries_mix() -> None:
    assert len(parse_bucket_list("0@mem://a,1@file:///tmp/b")) == 2


def test_weights_parse_and_check_the_ids() -> None:
    assert parse_weights("0:3,1:1") == {0: 3, 1: 1}
    assert parse_weights(" 1:0 , 0:2", (0, 1)) == {1: 0, 0: 2}
    assert format_weights({1: 0, 0: 2}) == "0:2,1:0"
    for bad in ("0:0,1:0", "0:-1", "0:1,0:2", "a:1", "0:1"):
        with pytest.raises(InvalidArgumentError):
            parse_weights(bad, (0, 1))


def test_config_keys_validate_lists_and_weights() -> None:
    config = Config.from_sources(
        env={
            "S3STREAM_S3_DATA_BUCKETS": "0@mem://a,1@mem://b",
            "S3STREAM_S3_DATA_BUCKETS_STRATEGY": "sharding",
            "S3STREAM_S3_DATA_BUCKETS_WEIGHTS": "0:3,1:1",
        }
    )
    assert config.data_buckets_strategy == "sharding"
    assert config.data_buckets_request_timeout_ms == 2000
    with pytest.raises(InvalidArgumentError, match="strategy"):
        Config(data_buckets_strategy="random")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        Config(data_buckets="0@mem://a,0@mem://b")
    with pytest.raises(InvalidArgumentError):
        Config(data_buckets_weights="0:0")
