"""A bucket list as the storage binding records it, and the rule a later open's list must follow.

The record (``binding.STORAGE_BOUND_KEY``) holds the whole list, each entry ``N@<uri without
credentials>``, in list order. A later open must name every recorded id with the same bucket
(protocol, bucket, endpoint and prefix; tuning keys may differ) and keep the recorded first bucket
first: objects with no placement row live there. It may add ids (they are appended to the record);
removing an id or pointing it elsewhere is refused with ConflictError naming it, because the objects
placed there would no longer be found.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from s3stream.buckets.spec import BucketEntry, parse_bucket_list, redacted
from s3stream.errors import ConflictError
from s3stream.storage.uri import BucketURI, parse_bucket_uri


def list_without_secrets(bucket_list: str, without_secrets: Callable[[str], str]) -> str:
    """``bucket_list`` as recorded: each entry ``N@`` + the entry without credentials."""
    entries = parse_bucket_list(bucket_list)
    return ",".join(_with_id(BucketEntry(e.bucket_id, without_secrets(e.uri), e.protocol)) for e in entries)


def _entries(text: str) -> tuple[BucketEntry, ...]:
    return parse_bucket_list(text)


def _with_id(entry: BucketEntry) -> str:
    """The entry with its ``N@`` prefix (a lone entry may have been given without one)."""
    return entry.uri if re.match(r"^\s*\d+@", entry.uri) else f"{entry.bucket_id}@{entry.uri}"


def check_against_record(
    recorded: str, given: str, identity: Callable[[BucketURI], tuple[str, ...]]
) -> str | None:
    """ConflictError unless ``given`` keeps every bucket of ``recorded`` (same id, same storage) and
    its first bucket first. Returns the record to store when ``given`` adds ids (else None)."""
    old, new = _entries(recorded), _entries(given)
    by_id = {e.bucket_id: e for e in new}
    for entry in old:
        match = by_id.get(entry.bucket_id)
        if match is None:
            raise ConflictError(
                f"bucket {entry.bucket_id} ({redacted(entry.uri)!r}) holds objects of this data dir and is "
                f"missing from the bucket list given: a bucket may be added, never removed"
            )
        if identity(parse_bucket_uri(match.uri)) != identity(parse_bucket_uri(entry.uri)):
            raise ConflictError(
                f"bucket {entry.bucket_id} is recorded as {redacted(entry.uri)!r}, not {redacted(match.uri)!r}: "
                "a bucket id always names the same bucket"
            )
    if new[0].bucket_id != old[0].bucket_id:
        raise ConflictError(
            f"bucket {old[0].bucket_id} must stay first in the bucket list (objects without a placement "
            f"record live in it), not bucket {new[0].bucket_id}"
        )
    added = [e for e in new if e.bucket_id not in {o.bucket_id for o in old}]
    if not added:
        return None
    return ",".join(_with_id(e) for e in (*old, *added))


def recorded_bucket_ids(recorded_uri: str | None) -> tuple[int, ...]:
    """The bucket ids of a storage record's URI, in list order (a single bucket: its id, 0 if none;
    the local ``objects/`` folder, None: ``(0,)``)."""
    if recorded_uri is None:
        return (0,)
    return tuple(e.bucket_id for e in parse_bucket_list(recorded_uri))
