"""Object keys in AutoMQ's scheme: reversed hex id, namespace, decimal id (``docs/format.md`` section 3).

The reversed hex prefix spreads consecutive ids over the key space (S3 partitions by prefix).
"""

from __future__ import annotations

import re

from s3stream.errors import InvalidArgumentError
from s3stream.storage.keys import SEGMENT_CHARS_MAX

DEFAULT_NAMESPACE = "DEFAULT"
_NAMESPACE = re.compile(r"[A-Za-z0-9_.\-]+")
_DECIMAL = re.compile(r"0|[1-9][0-9]*")
OBJECT_ID_MAX = (1 << 63) - 1


def _check_namespace(namespace: str) -> None:
    """Letters, digits, ``_ . -``: one valid key segment (:mod:`s3stream.storage.keys`), so not ``.``/``..``."""
    if (
        not isinstance(namespace, str)
        or not _NAMESPACE.fullmatch(namespace)
        or namespace in (".", "..")
        or len(namespace) > SEGMENT_CHARS_MAX
    ):
        raise InvalidArgumentError(
            f"bad object key namespace {namespace!r:.80}: use 1..{SEGMENT_CHARS_MAX} of letters, digits, _ . -"
        )


def object_key(object_id: int, namespace: str = DEFAULT_NAMESPACE) -> str:
    """``reverse(f"{object_id:08x}") + "/" + namespace + "/" + str(object_id)``; 4660 -> ``43210000/ns/4660``."""
    if isinstance(object_id, bool) or not isinstance(object_id, int) or not 0 <= object_id <= OBJECT_ID_MAX:
        raise InvalidArgumentError(f"object id must be an int in [0, 2**63), got {object_id!r}")
    _check_namespace(namespace)
    return f"{object_id:08x}"[::-1] + "/" + namespace + "/" + str(object_id)


def parse_object_key(key: str) -> tuple[int, str]:
    """The inverse of :func:`object_key`: ``(object_id, namespace)``."""
    parts = key.split("/") if isinstance(key, str) else []
    if len(parts) != 3 or not _DECIMAL.fullmatch(parts[2]) or not _NAMESPACE.fullmatch(parts[1]):
        raise InvalidArgumentError(f"not an object key: {key!r}")
    object_id = int(parts[2])
    if object_id > OBJECT_ID_MAX or parts[0] != f"{object_id:08x}"[::-1]:
        raise InvalidArgumentError(f"not an object key: {key!r}")
    return object_id, parts[1]
