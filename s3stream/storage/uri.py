"""Bucket URIs in AutoMQ's form, and :func:`open_storage` that turns one into an ObjectStorage.

Forms (``<id>@`` is optional; only one bucket per URI):

* ``0@s3://bucket?region=us-east-1&endpoint=http://127.0.0.1:7480&pathStyle=true`` plus optional
  ``accessKey``/``secretKey`` (else ``KAFKA_S3_ACCESS_KEY``/``KAFKA_S3_SECRET_KEY`` or botocore's
  chain), ``authType=static|instance`` (``instance``: ignore URI keys, use the chain), ``prefix``
  (every key under this sub-prefix), ``checksumMode=when_supported|when_required``,
  ``apiCallTimeoutMs`` (overall deadline per call, 30000), ``apiCallAttemptTimeoutMs`` (10000), and
  our tuning keys ``multipartThresholdBytes``, ``partSizeBytes``, ``partConcurrency``,
  ``maxInflightRequests``, ``listPageSize``;
* ``file:///absolute/path``: :class:`LocalObjectStorage` rooted there;
* ``mem://name``: a process-wide :class:`MemoryObjectStorage` per name (same name, same store until
  it is closed).

Unknown query keys, repeated keys and malformed values raise InvalidArgumentError naming the key.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, unquote, urlsplit

from s3stream.errors import InvalidArgumentError
from s3stream.storage.base import ObjectStorage
from s3stream.storage.retry import RetryPolicy

if TYPE_CHECKING:
    from s3stream.storage.s3client import S3Config

_ID_PREFIX = re.compile(r"^(?:(-?\d+)@)?(?P<rest>.*)$", re.DOTALL)
_SECRET_VALUE = re.compile(r"(secretKey=)[^&#]*", re.IGNORECASE)
_BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9.\-_]{0,254}$", re.IGNORECASE)


@dataclass(frozen=True)
class BucketURI:
    """A parsed bucket URI: ``protocol`` is ``s3``, ``file`` or ``mem``."""

    bucket_id: int
    protocol: str
    bucket: str
    """S3 bucket, memory store name, or the local root path."""
    params: dict[str, str]


def _redacted(uri: str) -> str:
    """``uri`` fit for an error message: the value of ``secretKey`` replaced by ``***``."""
    return _SECRET_VALUE.sub(r"\1***", uri)


def parse_bucket_uri(uri: str) -> BucketURI:
    if not isinstance(uri, str):
        raise InvalidArgumentError(f"bucket URI must be a str, got {type(uri).__name__}")
    if not uri.strip():
        raise InvalidArgumentError("bucket URI is empty")
    uri = uri.strip()
    shown = _redacted(uri)
    if re.search(r",\s*-?\d+@", uri):
        raise InvalidArgumentError(f"more than one bucket in {shown!r}: only one is supported")
    match = _ID_PREFIX.match(uri)
    assert match is not None
    bucket_id = int(match.group(1) or 0)
    try:
        parts = urlsplit(match.group("rest"))
    except ValueError as exc:
        raise InvalidArgumentError(f"bucket URI {shown!r} is malformed: {exc}") from exc
    protocol = parts.scheme.lower()
    if protocol not in ("s3", "file", "mem"):
        raise InvalidArgumentError(f"bucket URI {shown!r}: protocol must be s3, file or mem")
    if parts.fragment:
        raise InvalidArgumentError(f"bucket URI {shown!r}: fragments are not allowed")
    params: dict[str, str] = {}
    try:
        pairs = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError as exc:  # its message may quote a secret: not shown
        raise InvalidArgumentError(
            f"bucket URI {shown!r}: the query must be key=value pairs joined by '&'"
        ) from exc
    for name, value in pairs:
        if name in params:
            raise InvalidArgumentError(f"bucket URI: key {name!r} given twice")
        params[name] = value
    if protocol == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise InvalidArgumentError(f"bucket URI {shown!r}: use file:///absolute/path")
        if params:
            raise InvalidArgumentError(f"bucket URI {shown!r}: unknown key {next(iter(params))!r}")
        return BucketURI(bucket_id, protocol, unquote(parts.path), params)
    name = parts.netloc
    if protocol == "mem":
        if parts.path not in ("", "/") or params:
            raise InvalidArgumentError(f"bucket URI {shown!r}: use mem://name")
        return BucketURI(bucket_id, protocol, name, params)
    if not _BUCKET_NAME.match(name) or parts.path not in ("", "/"):
        raise InvalidArgumentError(f"bucket URI {shown!r}: bad bucket name {name!r}")
    return BucketURI(bucket_id, protocol, name, params)


def _bool(name: str, value: str) -> bool:
    if value.lower() in ("true", "1", "yes"):
        return True
    if value.lower() in ("false", "0", "no"):
        return False
    raise InvalidArgumentError(f"bucket URI: {name}={value!r} is not a boolean")


def _int(name: str, value: str, minimum: int = 1) -> int:
    try:
        number = int(value)
    except ValueError:
        raise InvalidArgumentError(f"bucket URI: {name}={value!r} is not an integer") from None
    if number < minimum:
        raise InvalidArgumentError(f"bucket URI: {name}={value!r} must be >= {minimum}")
    return number


_S3_KEYS: dict[str, Callable[[str, str], tuple[str, Any]]] = {
    "region": lambda n, v: ("region", v),
    "endpoint": lambda n, v: ("endpoint", v or None),
    "pathStyle": lambda n, v: ("path_style", _bool(n, v)),
    "accessKey": lambda n, v: ("access_key", v),
    "secretKey": lambda n, v: ("secret_key", v),
    "prefix": lambda n, v: ("prefix", v),
    "checksumMode": lambda n, v: ("checksum_mode", v),
    "multipartThresholdBytes": lambda n, v: ("multipart_threshold_bytes", _int(n, v, 0)),
    "partSizeBytes": lambda n, v: ("part_size_bytes", _int(n, v)),
    "partConcurrency": lambda n, v: ("part_concurrency_max", _int(n, v)),
    "maxInflightRequests": lambda n, v: ("inflight_requests_max", _int(n, v)),
    "listPageSize": lambda n, v: ("list_page_size", _int(n, v)),
}


def s3_config_from_uri(parsed: BucketURI) -> S3Config:
    """The S3Config a parsed ``s3://`` URI describes."""
    from s3stream.storage.s3client import S3Config  # botocore is imported only where S3 is used

    fields: dict[str, Any] = {}
    retry = RetryPolicy()
    auth_type = "static"
    for name, value in parsed.params.items():
        if name in _S3_KEYS:
            attr, converted = _S3_KEYS[name](name, value)
            fields[attr] = converted
        elif name == "apiCallTimeoutMs":
            retry = replace(retry, deadline_s=_int(name, value) / 1000)
        elif name == "apiCallAttemptTimeoutMs":
            retry = replace(retry, attempt_timeout_s=_int(name, value) / 1000)
        elif name == "authType":
            if value not in ("static", "instance"):
                raise InvalidArgumentError(f"bucket URI: authType={value!r} must be static or instance")
            auth_type = value
        else:
            raise InvalidArgumentError(f"bucket URI: unknown key {name!r}")
    if auth_type == "instance":
        fields.pop("access_key", None)
        fields.pop("secret_key", None)
    endpoint = fields.get("endpoint")
    if endpoint is not None:
        try:
            split = urlsplit(endpoint)
            scheme, _ = split.scheme, split.port  # .port raises ValueError for a port not in 0-65535
        except ValueError as exc:
            raise InvalidArgumentError(f"bucket URI: endpoint {endpoint!r} is malformed: {exc}") from exc
        if scheme not in ("http", "https") or not split.hostname:
            raise InvalidArgumentError(f"bucket URI: endpoint {endpoint!r} must be an http(s) URL")
    return S3Config(bucket=parsed.bucket, retry=retry, **fields)


_memory_stores: dict[str, Any] = {}


def open_storage(uri: str) -> ObjectStorage:
    """An ObjectStorage for a bucket URI (``s3://``, ``file://``, ``mem://``); connects lazily."""
    parsed = parse_bucket_uri(uri)
    if parsed.protocol == "file":
        from s3stream.storage.local import LocalObjectStorage

        return LocalObjectStorage(parsed.bucket)
    if parsed.protocol == "mem":
        from s3stream.storage.memory import MemoryObjectStorage

        store = _memory_stores.get(parsed.bucket)
        if store is None or store._closed:
            store = _memory_stores[parsed.bucket] = MemoryObjectStorage(parsed.bucket)
        memory: ObjectStorage = store
        return memory
    from s3stream.storage.s3 import S3ObjectStorage

    return S3ObjectStorage(s3_config_from_uri(parsed))
