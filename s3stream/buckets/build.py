"""Build a :class:`~s3stream.buckets.storage.MultiBucketStorage` from a bucket list and the config.

Each entry is opened as today's single bucket is (:func:`s3stream.storage.uri.open_storage`). An S3
entry without its own ``apiCallAttemptTimeoutMs`` / ``apiCallTimeoutMs`` gets
``s3.data.buckets.request.timeout.ms`` and twice it: a bucket that stops answering then fails a
request within seconds, so uploads move to another bucket instead of waiting out the single-bucket
deadline (30 s).
"""

from __future__ import annotations

from s3stream.buckets.health import BucketHealth
from s3stream.buckets.spec import BucketEntry, parse_bucket_list, parse_weights
from s3stream.buckets.storage import MultiBucketStorage
from s3stream.buckets.strategy import make_strategy
from s3stream.config import Config
from s3stream.storage.base import ObjectStorage
from s3stream.storage.uri import open_storage, parse_bucket_uri


def entry_uri(entry: BucketEntry, request_timeout_ms: int) -> str:
    """The entry's URI with the multi-bucket request timeouts added where it names none."""
    if entry.protocol != "s3":
        return entry.uri
    params = parse_bucket_uri(entry.uri).params
    extra = []
    if "apiCallAttemptTimeoutMs" not in params:
        extra.append(f"apiCallAttemptTimeoutMs={request_timeout_ms}")
    if "apiCallTimeoutMs" not in params:
        extra.append(f"apiCallTimeoutMs={2 * request_timeout_ms}")
    if not extra:
        return entry.uri
    return entry.uri + ("&" if "?" in entry.uri else "?") + "&".join(extra)


def build_multi_bucket_storage(bucket_list: str, config: Config) -> MultiBucketStorage:
    """The storage of ``bucket_list`` (``s3.data.buckets`` form) with the config's strategy, weights
    and health settings. No request is sent (S3 clients connect in :meth:`MultiBucketStorage.connect`)."""
    entries = parse_bucket_list(bucket_list)
    ids = tuple(e.bucket_id for e in entries)
    weights = parse_weights(config.data_buckets_weights, ids) if config.data_buckets_weights else None
    strategy = make_strategy(config.data_buckets_strategy, ids, weights)
    health = BucketHealth(
        ids,
        errors_max=config.data_buckets_failover_errors,
        window_ms=config.data_buckets_failover_window_ms,
        probe_interval_ms=config.data_buckets_probe_interval_ms,
        probe_successes=config.data_buckets_probe_successes,
        request_timeout_ms=config.data_buckets_request_timeout_ms,
    )
    buckets: dict[int, ObjectStorage] = {}
    names: dict[int, str] = {}
    for entry in entries:  # nothing connects yet: a later entry's error leaves nothing to close
        buckets[entry.bucket_id] = open_storage(entry_uri(entry, config.data_buckets_request_timeout_ms))
        parsed = parse_bucket_uri(entry.uri)
        names[entry.bucket_id] = f"{parsed.protocol}://{parsed.bucket}"
    return MultiBucketStorage(buckets, strategy=strategy, health=health, names=names)
