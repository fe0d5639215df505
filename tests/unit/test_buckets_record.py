"""The bucket list in the storage record: recorded without credentials, ids only added, the first
bucket kept first, and the ids a command validates weights against."""

from __future__ import annotations

import pytest

from s3stream import binding
from s3stream.binding import RecordedStorage, storage_to_open, without_secrets
from s3stream.buckets.record import recorded_bucket_ids
from s3stream.errors import ConflictError

A = "0@s3://a?region=r&endpoint=http://h:1&accessKey=AK&secretKey=SK"
B = "1@s3://b?region=r&endpoint=http://h:2&secretKey=SK2&partSizeBytes=6000000"


def test_a_list_is_recorded_without_credentials_each_entry_with_its_id() -> None:
    recorded = without_secrets(f"{A},{B}")
    assert "SK" not in recorded
    assert "AK" not in recorded
    assert recorded.startswith("0@s3://a?")
    assert ",1@s3://b?" in recorded
    assert recorded_bucket_ids(recorded) == (0, 1)
    assert recorded_bucket_ids("s3://a?region=r") == (0,)
    assert recorded_bucket_ids(None) == (0,)


def test_a_later_open_may_add_ids_and_tune_but_not_drop_move_or_repoint() -> None:
    record = RecordedStorage(without_secrets(f"{A},{B}"), "ns")
    tuned = B.replace("partSizeBytes=6000000", "partSizeBytes=7000000")
    assert storage_to_open(record, f"{A},{tuned}", namespace="ns") == f"{A},{tuned}"
    grown = f"{A},{B},2@s3://c?region=r&endpoint=http://h:3"
    assert storage_to_open(record, grown, namespace="ns") == grown
    for refused in (A, f"{B.replace('1@', '0@')},{A.replace('0@', '1@')}", f"{A},1@s3://other?region=r"):
        with pytest.raises(ConflictError):
            storage_to_open(record, refused, namespace="ns")
    assert storage_to_open(record, None, namespace="ns") == record.bucket_uri


def test_a_single_bucket_may_grow_into_a_list_that_keeps_it_first() -> None:
    single = RecordedStorage(without_secrets("s3://a?region=r&endpoint=http://h:1"), "ns")
    assert storage_to_open(single, f"{A},{B}", namespace="ns") == f"{A},{B}"
    with pytest.raises(ConflictError, match="first"):
        storage_to_open(single, f"{B},{A}", namespace="ns")
    # a single bucket given for a single record: today's rule, unchanged
    assert binding.storage_to_open(single, "s3://a?region=r&endpoint=http://h:1", namespace="ns")
