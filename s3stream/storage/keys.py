"""Object key and byte-range validation shared by every ObjectStorage backend.

All backends accept exactly the same keys, so a key that works on the local store works on S3 and
the other way round. A key is 1..``KEY_MAX_BYTES`` characters: segments separated by ``/``, each
segment non-empty, at most ``SEGMENT_CHARS_MAX`` characters (filesystems cap a name at 255
bytes and the local store's temporary names add 34), not ``.`` or ``..``, made only of ASCII letters, digits and ``-_.=+,@!``. That
rules out absolute paths, ``..`` escapes, empty segments, NUL and control characters, spaces,
backslashes and ``~`` (the local store's temporary files carry ``~`` so they can never be a key).
AutoMQ's keys (``<reversed hex>/<namespace>/<object id>``) and its ``__automq/...`` keys fit.
"""

from __future__ import annotations

import string

from s3stream.errors import InvalidArgumentError

KEY_MAX_BYTES = 1024
"""S3's limit on a key (UTF-8 bytes); our keys are ASCII so characters == bytes."""
KEY_CHARS = frozenset(string.ascii_letters + string.digits + "-_.=+,@!")
"""Characters allowed inside one segment."""
SEGMENT_CHARS_MAX = 200
TEMP_MARKER = "~"
"""Never in a key: the local store names its temporary files with it."""

assert TEMP_MARKER not in KEY_CHARS
assert "/" not in KEY_CHARS
assert SEGMENT_CHARS_MAX + 2 + 32 <= 255


def _check_segment(key: str, segment: str, *, partial: bool) -> None:
    if not partial and segment in ("", ".", ".."):
        raise InvalidArgumentError(f"object key {key!r}: empty, '.' or '..' segment")
    if len(segment) > SEGMENT_CHARS_MAX:
        raise InvalidArgumentError(f"object key {key!r}: a segment is longer than {SEGMENT_CHARS_MAX}")
    bad = set(segment) - KEY_CHARS
    if bad:
        shown = ", ".join(sorted(repr(c) for c in bad))
        raise InvalidArgumentError(f"object key {key!r}: characters not allowed: {shown}")


def validate_key(key: object) -> str:
    """Return ``key`` if it is a valid object key, else raise InvalidArgumentError."""
    if not isinstance(key, str):
        raise InvalidArgumentError(f"object key must be a str, got {type(key).__name__}")
    if not key:
        raise InvalidArgumentError("object key is empty")
    if len(key) > KEY_MAX_BYTES:
        raise InvalidArgumentError(f"object key longer than {KEY_MAX_BYTES} characters: {key[:64]!r}...")
    for segment in key.split("/"):
        _check_segment(key, segment, partial=False)
    return key


def validate_prefix(prefix: object) -> str:
    """Return ``prefix`` if it can start a valid key ("" lists everything)."""
    if not isinstance(prefix, str):
        raise InvalidArgumentError(f"key prefix must be a str, got {type(prefix).__name__}")
    if len(prefix) > KEY_MAX_BYTES:
        raise InvalidArgumentError(f"key prefix longer than {KEY_MAX_BYTES} characters")
    if not prefix:
        return prefix
    *whole, last = prefix.split("/")
    for segment in whole:
        _check_segment(prefix, segment, partial=False)
    _check_segment(prefix, last, partial=True)
    return prefix


def validate_range(key: str, start: object, end: object) -> tuple[int, int | None]:
    """Check the shape of ``[start, end)`` before any I/O (bounds are checked against the size later)."""
    if not isinstance(start, int) or isinstance(start, bool) or start < 0:
        raise InvalidArgumentError(f"read of {key!r}: start must be an int >= 0, got {start!r}")
    if end is None:
        return start, None
    if not isinstance(end, int) or isinstance(end, bool) or end < start:
        raise InvalidArgumentError(f"read of {key!r}: end must be None or an int >= start, got {end!r}")
    return start, end


def resolve_range(key: str, start: int, end: int | None, size_bytes: int) -> tuple[int, int]:
    """``[start, end)`` within an object of ``size_bytes``; past the end is InvalidArgumentError.

    ``end=None`` means the object's end; ``start == size`` gives an empty range.
    """
    stop = size_bytes if end is None else end
    if start > size_bytes or stop > size_bytes:
        raise InvalidArgumentError(
            f"read of {key!r}: range [{start}, {end}) lies beyond the object's {size_bytes} bytes"
        )
    return start, stop
