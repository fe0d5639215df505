"""``s3.data.buckets`` and ``s3.data.buckets.weights``: parsing and validation, nothing else.

A bucket list is AutoMQ's form, entries joined by ``,``: ``0@s3://a?region=..&endpoint=..,1@s3://b?..``.
Each entry is one bucket URI (:mod:`s3stream.storage.uri`) with a stable id ``N@`` (an int >= 0,
unique in the list). A lone entry may omit the id (it is 0). A comma inside a query value must be
percent-encoded (``%2C``): the list is split on every literal comma. All entries are ``s3``, or all
are ``mem``/``file`` (tests and local use); a mix is refused. Weights are ``id:w,id:w`` with ints >= 0,
not all 0. Every error is an InvalidArgumentError naming the entry (secrets redacted).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from s3stream.errors import InvalidArgumentError
from s3stream.logfmt import redact
from s3stream.metadata.placement_ops import BUCKET_ID_MAX, BUCKETS_PER_OBJECT_MAX
from s3stream.storage.uri import parse_bucket_uri

_ENTRY_ID = re.compile(r"^\s*(\d+)@")
_SECRET_VALUE = re.compile(r"(secretKey=)[^&#,]*", re.IGNORECASE)
WEIGHT_MAX = 1_000_000
BUCKETS_MAX = BUCKETS_PER_OBJECT_MAX
"""Buckets in one list (replication writes each object to every one)."""


@dataclass(frozen=True, slots=True)
class BucketEntry:
    """One bucket of a list: its stable id and its URI (``N@`` prefix included, as given)."""

    bucket_id: int
    uri: str
    protocol: str


def redacted(text: str) -> str:
    """``text`` with every credential :func:`s3stream.logfmt.redact` knows (registered secrets, a
    comma in one included, URL passwords, secret parameters) and the value of every ``secretKey``
    replaced by ``***`` (for messages)."""
    return _SECRET_VALUE.sub(r"\1***", redact(text))


def is_bucket_list(text: str | None) -> bool:
    """Whether ``text`` names more than one bucket (a list of one is a single bucket)."""
    return text is not None and len([p for p in text.split(",") if p.strip()]) > 1


def parse_bucket_list(text: str) -> tuple[BucketEntry, ...]:
    """The entries of a bucket list, in list order (the order failover and non-object keys follow)."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidArgumentError("the bucket list is empty")
    parts = text.split(",")
    if len(parts) > BUCKETS_MAX:
        raise InvalidArgumentError(f"at most {BUCKETS_MAX} buckets, got {len(parts)}")
    entries: list[BucketEntry] = []
    for index, raw in enumerate(parts):
        part = raw.strip()
        shown = redacted(part)
        if not part:
            raise InvalidArgumentError(f"bucket list entry {index} is empty")
        if len(parts) > 1 and _ENTRY_ID.match(part) is None:
            raise InvalidArgumentError(
                f"bucket list entry {shown!r}: give it a stable id, as in '0@s3://...'"
            )
        try:
            parsed = parse_bucket_uri(part)
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(f"bucket list entry {index} ({shown!r}): {exc}") from exc
        if not 0 <= parsed.bucket_id <= BUCKET_ID_MAX:
            raise InvalidArgumentError(f"bucket list entry {shown!r}: the id must be in [0, {BUCKET_ID_MAX}]")
        if any(e.bucket_id == parsed.bucket_id for e in entries):
            raise InvalidArgumentError(f"bucket list entry {shown!r}: id {parsed.bucket_id} is given twice")
        entries.append(BucketEntry(parsed.bucket_id, part, parsed.protocol))
    kinds = {e.protocol == "s3" for e in entries}
    if len(kinds) > 1:
        odd = next(e for e in entries if (e.protocol == "s3") != (entries[0].protocol == "s3"))
        raise InvalidArgumentError(
            f"bucket list entry {redacted(odd.uri)!r}: entries must all be s3, or all mem/file"
        )
    return tuple(entries)


def parse_weights(text: str, bucket_ids: tuple[int, ...] | None = None) -> dict[int, int]:
    """``{bucket id: weight}`` of ``id:w,id:w``; with ``bucket_ids``, every id listed and no other."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidArgumentError("the bucket weights are empty: give id:weight pairs such as 0:1,1:1")
    weights: dict[int, int] = {}
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d{1,10}):(\d{1,10})\s*", part)
        if match is None:
            raise InvalidArgumentError(f"bucket weight {part.strip()[:40]!r}: use id:weight (ints >= 0)")
        bucket_id, weight = int(match.group(1)), int(match.group(2))
        if bucket_id in weights:
            raise InvalidArgumentError(f"bucket weight {part.strip()!r}: id {bucket_id} is given twice")
        if weight > WEIGHT_MAX:
            raise InvalidArgumentError(f"bucket weight {part.strip()!r}: at most {WEIGHT_MAX}")
        weights[bucket_id] = weight
    if not any(weights.values()):
        raise InvalidArgumentError(f"bucket weights {text.strip()!r}: at least one must be above 0")
    if bucket_ids is not None and set(weights) != set(bucket_ids):
        missing = sorted(set(bucket_ids) - set(weights))
        unknown = sorted(set(weights) - set(bucket_ids))
        raise InvalidArgumentError(
            f"bucket weights {text.strip()!r} must name every bucket id {sorted(bucket_ids)} and no other "
            f"(missing {missing}, unknown {unknown})"
        )
    return weights


def format_weights(weights: dict[int, int]) -> str:
    """The text form of ``weights`` (ids ascending), as stored in the KV."""
    return ",".join(f"{bucket_id}:{weights[bucket_id]}" for bucket_id in sorted(weights))
