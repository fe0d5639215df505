"""upload_shape: how an S3 upload sizes its parts under a ``buffer_max_bytes`` (pure, no server)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from s3stream.errors import InvalidArgumentError
from s3stream.storage.base import MIN_PART_SIZE_BYTES
from s3stream.storage.s3upload import UploadShape, upload_shape

MiB = 1024 * 1024
DEFAULTS = {"part_size_bytes": 16 * MiB, "part_concurrency_max": 4, "multipart_threshold_bytes": 32 * MiB}


def test_no_limit_keeps_the_configured_shape() -> None:
    assert upload_shape(**DEFAULTS) == UploadShape(16 * MiB, 4, 32 * MiB)
    assert upload_shape(**DEFAULTS).held_max_bytes == 80 * MiB
    assert upload_shape(**DEFAULTS, buffer_max_bytes=80 * MiB) == UploadShape(16 * MiB, 4, 32 * MiB)


@pytest.mark.parametrize(
    ("buffer_max_mib", "shape"),
    [
        (79, UploadShape(16 * MiB, 3, 32 * MiB)),  # fewer parts in flight, same part size
        (32, UploadShape(16 * MiB, 1, 16 * MiB)),  # two parts: one in flight, one being filled
        (31, UploadShape(int(15.5 * MiB), 1, int(15.5 * MiB))),  # smaller parts, one in flight
        (10, UploadShape(5 * MiB, 1, 5 * MiB)),
        (9, UploadShape(9 * MiB, 0, 9 * MiB)),  # one part, sent inline
        (5, UploadShape(5 * MiB, 0, 5 * MiB)),
        (1, UploadShape(5 * MiB, 0, 5 * MiB)),  # never below S3's minimum part
    ],
)
def test_a_limit_shrinks_parts_in_flight_then_part_size(buffer_max_mib: int, shape: UploadShape) -> None:
    assert upload_shape(**DEFAULTS, buffer_max_bytes=buffer_max_mib * MiB) == shape


@given(
    part_mib=st.integers(5, 64),
    concurrency=st.integers(1, 16),
    threshold_mib=st.integers(0, 128),
    buffer_max=st.integers(1, 2048 * MiB),
)
def test_the_shape_respects_the_limit_and_s3(
    part_mib: int, concurrency: int, threshold_mib: int, buffer_max: int
) -> None:
    shape = upload_shape(
        part_size_bytes=part_mib * MiB,
        part_concurrency_max=concurrency,
        multipart_threshold_bytes=threshold_mib * MiB,
        buffer_max_bytes=buffer_max,
    )
    assert MIN_PART_SIZE_BYTES <= shape.part_size_bytes <= part_mib * MiB
    assert 0 <= shape.part_concurrency_max <= concurrency
    assert shape.held_max_bytes <= max(buffer_max, MIN_PART_SIZE_BYTES)
    assert shape.staged_max_bytes <= min(threshold_mib * MiB, shape.held_max_bytes)
    if (concurrency + 1) * part_mib * MiB <= buffer_max:  # a limit that fits changes nothing
        assert shape == upload_shape(
            part_size_bytes=part_mib * MiB,
            part_concurrency_max=concurrency,
            multipart_threshold_bytes=threshold_mib * MiB,
        )


@pytest.mark.parametrize("bad", [0, -5, True])
def test_bad_limits_are_invalid(bad: int) -> None:
    with pytest.raises(InvalidArgumentError):
        upload_shape(**DEFAULTS, buffer_max_bytes=bad)
