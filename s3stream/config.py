"""The one validated configuration of s3stream: AutoMQ key names, embedded-engine defaults, limits.

Every key has a default suited to an *embedded* engine (a library inside one process on a laptop or a
small VM, not a broker with tens of GiB of memory); the table in :data:`KEYS` names each key, its
default, its limits and where the default comes from. Values load, later ones winning, from the
defaults, a TOML file (flat quoted keys ``"s3.wal.capacity" = 1073741824`` or nested tables), the
environment (``S3STREAM_`` + key upper-cased with dots as underscores, e.g. ``S3STREAM_S3_WAL_CAPACITY``)
and keyword overrides (field names, e.g. ``wal_capacity_bytes=...``). Sizes accept plain integers or a
unit suffix (``64MiB``, ``1GiB``, ``512KiB``). A value outside its limits raises
:class:`~s3stream.errors.InvalidArgumentError` naming the key.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from s3stream.errors import InvalidArgumentError

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

ENV_PREFIX = "S3STREAM_"


@dataclass(frozen=True, slots=True)
class Key:
    """One configuration key: its AutoMQ name, the Config field, its limits and its default's origin."""

    name: str
    field: str
    kind: type
    minimum: int | None = None
    maximum: int | None = None
    doc: str = ""
    choices: tuple[str, ...] = ()
    """For a string key: the values it takes (none: any string its own check allows)."""
    aliases: tuple[str, ...] = ()
    """Older names still accepted in a TOML file and the environment."""


@dataclass(frozen=True, slots=True)
class Config:
    """Validated engine configuration. Build with :meth:`from_sources` or the constructor (validated)."""

    # -- WAL -----------------------------------------------------------------------------------
    wal_capacity_bytes: int = 256 * MiB
    wal_thread_count: int = 8
    wal_record_max_bytes: int = 16 * MiB
    wal_append_timeout_ms: int = 30_000
    wal_aio: Literal["auto", "uring", "adaptive", "off"] = "adaptive"
    # -- LogCache and uploads ------------------------------------------------------------------
    wal_cache_size_bytes: int = 128 * MiB
    wal_upload_threshold_bytes: int = 32 * MiB
    wal_upload_interval_ms: int = 10_000
    upload_inflight_max: int = 4
    upload_retry_backoff_ms: int = 100
    upload_retry_backoff_max_ms: int = 5_000
    append_backpressure_wait_ms: int = 30_000
    close_timeout_ms: int = 60_000
    record_max_bytes: int = 8 * MiB
    # -- objects -------------------------------------------------------------------------------
    block_cache_size_bytes: int = 64 * MiB
    object_block_size_bytes: int = 512 * KiB
    object_part_size_bytes: int = 16 * MiB
    stream_object_split_size_bytes: int = 8 * MiB
    max_stream_num_per_stream_set_object: int = 20_000
    max_stream_object_num_per_commit: int = 10_000
    object_prepared_ttl_ms: int = 60 * 60 * 1000
    object_delete_retention_minutes: int = 10
    # -- identity ------------------------------------------------------------------------------
    namespace: str = "s3stream"
    node_id: int = 0
    node_lease_ms: int = 10_000
    metadata_url: str = ""
    metadata_copy_wait_ms: int = 30_000
    # -- telemetry (s3stream.metrics) ----------------------------------------------------------
    metrics_exporter_uri: str = ""
    metrics_level: str = "INFO"
    # -- compaction (used by compaction/) ------------------------------------------------------
    stream_set_object_compaction_interval_minutes: int = 5
    stream_set_object_compaction_cache_size_bytes: int = 200 * MiB
    stream_set_object_compaction_stream_split_size_bytes: int = 8 * MiB
    stream_set_object_compaction_force_split_minutes: int = 120
    stream_set_object_compaction_max_num: int = 500
    stream_object_compaction_interval_minutes: int = 60
    stream_object_compaction_max_size_bytes: int = 10 * GiB
    network_baseline_bandwidth_bytes: int = 1 * GiB
    # -- cluster: reassignment and failover ----------------------------------------------------
    cluster_poll_ms: int = 100
    wal_failover_attach_cmd: str = ""
    wal_failover_progress_leases: int = 6
    wal_failover_run_failures_max: int = 3
    wal_failover_attempts_max: int = 5
    # -- several buckets (s3stream.buckets) ----------------------------------------------------
    data_buckets: str = ""
    data_buckets_strategy: Literal["round_robin", "failover", "replication", "sharding"] = "round_robin"
    data_buckets_weights: str = ""
    data_buckets_failover_errors: int = 3
    data_buckets_failover_window_ms: int = 10_000
    data_buckets_probe_interval_ms: int = 1_000
    data_buckets_probe_successes: int = 3
    data_buckets_request_timeout_ms: int = 2_000
    data_buckets_weights_poll_ms: int = 2_000
    # -- direct writes (objects uploaded elsewhere, committed by commit_objects) ----------------
    direct_prepared_ttl_ms: int = 24 * 60 * 60 * 1000

    def __post_init__(self) -> None:
        for key in KEYS:
            value = getattr(self, key.field)
            _check(key, value)
        if self.wal_upload_threshold_bytes > self.wal_cache_size_bytes:
            raise InvalidArgumentError(
                f"s3.wal.upload.threshold ({self.wal_upload_threshold_bytes}) must not exceed "
                f"s3.wal.cache.size ({self.wal_cache_size_bytes})"
            )
        if self.wal_record_max_bytes > self.wal_capacity_bytes // 4:
            raise InvalidArgumentError(
                f"s3.wal.record.size.max ({self.wal_record_max_bytes}) must be at most a quarter of "
                f"s3.wal.capacity ({self.wal_capacity_bytes})"
            )
        if self.record_max_bytes > self.wal_record_max_bytes:
            raise InvalidArgumentError(
                f"s3.record.size.max ({self.record_max_bytes}) must not exceed "
                f"s3.wal.record.size.max ({self.wal_record_max_bytes})"
            )
        if self.upload_retry_backoff_ms > self.upload_retry_backoff_max_ms:
            raise InvalidArgumentError(
                "s3.upload.retry.backoff.ms must not exceed s3.upload.retry.backoff.max.ms"
            )

    # -- loading -------------------------------------------------------------------------------
    @classmethod
    def from_sources(
        cls,
        toml_path: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
        **overrides: Any,
    ) -> Config:
        """Defaults, then the TOML file, then ``env`` (default ``os.environ``), then ``overrides``."""
        values: dict[str, Any] = {}
        if toml_path is not None and not isinstance(toml_path, str | os.PathLike):
            raise InvalidArgumentError(
                f"config file path must be a str or path, got {type(toml_path).__name__}"
            )
        if env is not None and not isinstance(env, Mapping):
            raise InvalidArgumentError(f"env must be a mapping of str to str, got {type(env).__name__}")
        if toml_path is not None:
            try:
                with Path(toml_path).open("rb") as f:
                    doc = tomllib.load(f)
            except OSError as exc:
                raise InvalidArgumentError(f"cannot read config file {toml_path}: {exc}") from exc
            except tomllib.TOMLDecodeError as exc:
                raise InvalidArgumentError(f"config file {toml_path} is not valid TOML: {exc}") from exc
            for name, raw in _flatten(doc).items():
                key = KEYS_BY_NAME.get(name)
                if key is None:
                    raise InvalidArgumentError(f"unknown config key {name!r} in {toml_path}")
                values[key.field] = _parse(key, raw)
        environ = os.environ if env is None else env
        for key in KEYS:
            for name in (*key.aliases, key.name):  # the current name wins over an alias
                env_name = env_var(name)
                if env_name in environ:
                    values[key.field] = _parse(key, environ[env_name])
        for field_name, raw in overrides.items():
            key = KEYS_BY_FIELD.get(field_name) or KEYS_BY_NAME.get(field_name)
            if key is None:
                raise InvalidArgumentError(f"unknown config field {field_name!r}")
            values[key.field] = _parse(key, raw)
        return cls(**values)

    def replace(self, **changes: Any) -> Config:
        """A copy with some fields changed (validated again)."""
        for field_name in changes:
            if field_name not in KEYS_BY_FIELD:
                raise InvalidArgumentError(f"unknown config field {field_name!r}")
        return dataclasses.replace(self, **changes)

    def as_keys(self) -> dict[str, int | str]:
        """The configuration by AutoMQ key name."""
        return {key.name: getattr(self, key.field) for key in KEYS}


KEYS: tuple[Key, ...] = (
    Key("s3.wal.capacity", "wal_capacity_bytes", int, 4 * MiB, 1 << 40,
        "WAL file size; AutoMQ 2 GiB, ours 256 MiB (embedded)"),
    Key("s3.wal.thread", "wal_thread_count", int, 1, 64, "WAL I/O depth (AutoMQ iodepth 8)"),
    Key("s3.wal.record.size.max", "wal_record_max_bytes", int, 4 * KiB, 1 << 30,
        "largest WAL record body (bounds append_atomic groups); ours 16 MiB"),
    Key("s3.wal.append.timeout.ms", "wal_append_timeout_ms", int, 1, 3_600_000,
        "AutoMQ WAL append timeout 30 s"),
    Key("s3.wal.aio", "wal_aio", str, None, None,
        "group writes by Linux native AIO (auto) or io_uring (uring) from the event loop where the WAL "
        "file is O_DIRECT, by AIO while other processes leave about one CPU free and on the I/O "
        "threads otherwise (adaptive), or on the WAL's I/O threads (off); ours adaptive: AIO is "
        "1.2-1.4x faster with room on the CPUs, but one producer's appends were 2.5-16x slower with "
        "the CPUs busy, where the threads do not slow down (wal.WalConfig.aio)",
        choices=("auto", "uring", "adaptive", "off")),
    Key("s3.wal.cache.size", "wal_cache_size_bytes", int, 1 * MiB, 1 << 40,
        "LogCache byte limit; AutoMQ library 200 MiB, ours 128 MiB"),
    Key("s3.wal.upload.threshold", "wal_upload_threshold_bytes", int, 64 * KiB, 1 << 40,
        "LogCache block size that starts an upload; AutoMQ min(cache/3, 500 MiB), ours 32 MiB"),
    Key("s3.wal.upload.interval.ms", "wal_upload_interval_ms", int, 1, 86_400_000,
        "time trigger of an upload; AutoMQ 1.7.3 60 s, ours 10 s (embedded: bound the WAL backlog)"),
    Key("s3.wal.upload.inflight.max", "upload_inflight_max", int, 1, 64,
        "uploads in flight at once (AutoMQ executor 4 threads)"),
    Key("s3.upload.retry.backoff.ms", "upload_retry_backoff_ms", int, 1, 600_000, "first retry delay"),
    Key("s3.upload.retry.backoff.max.ms", "upload_retry_backoff_max_ms", int, 1, 3_600_000,
        "largest retry delay (retries never stop: data is never dropped)"),
    Key("s3.append.backpressure.wait.ms", "append_backpressure_wait_ms", int, 0, 3_600_000,
        "how long an append waits for WAL/cache room before CapacityError; 0 raises at once"),
    Key("s3.close.timeout.ms", "close_timeout_ms", int, 1, 86_400_000,
        "how long Client.close and Stream.close wait for uploads (then UnavailableError; Client.close only "
        "logs it) and how long the open waits between checks of failing replay uploads; data stays in the WAL"),
    Key("s3.record.size.max", "record_max_bytes", int, 1 * KiB, 1 << 30,
        "largest record batch payload; ours 8 MiB"),
    Key("s3.block.cache.size", "block_cache_size_bytes", int, 1 * MiB, 1 << 40,
        "read-path block cache; AutoMQ library 100 MiB, ours 64 MiB"),
    Key("s3.object.block.size", "object_block_size_bytes", int, 4 * KiB, 64 * MiB,
        "data block threshold; AutoMQ broker 512 KiB"),
    Key("s3.object.part.size", "object_part_size_bytes", int, 5 * MiB, 5 * GiB,
        "multipart part threshold (S3 minimum 5 MiB); AutoMQ 16 MiB"),
    Key("s3.stream.object.split.size", "stream_object_split_size_bytes", int, 1, 1 << 40,
        "per-stream bytes of one upload written as a separate stream object; AutoMQ broker 8 MiB"),
    Key("s3.max.stream.num.per.stream.set.object", "max_stream_num_per_stream_set_object", int, 1, 1_000_000,
        "AutoMQ broker 20000"),
    Key("s3.max.stream.object.num.per.commit", "max_stream_object_num_per_commit", int, 1, 1_000_000,
        "AutoMQ 10000"),
    Key("s3.object.prepared.ttl.ms", "object_prepared_ttl_ms", int, 1, 7 * 86_400_000,
        "prepared object TTL before expiry and deletion; AutoMQ 60 min"),
    Key("s3.object.delete.retention.minutes", "object_delete_retention_minutes", int, 0, 100_000,
        "delay before a marked object is deleted; AutoMQ doc 10"),
    Key("s3.namespace", "namespace", str, None, None, "object key namespace"),
    Key("s3.node.id", "node_id", int, 0, (1 << 31) - 1, "this node's id", aliases=("node.id",)),
    Key("s3.node.lease.ms", "node_lease_ms", int, 100, 3_600_000,
        "how long a node stays alive in the metadata without a heartbeat; heartbeats every third of it"),
    Key("s3.metadata.url", "metadata_url", str, None, None,
        "sqlite:///path or postgresql://user:pass@host:port/db; empty: sqlite:///<data_dir>/metadata.db"),
    Key("s3.metadata.copy.wait.ms", "metadata_copy_wait_ms", int, 1, 3_600_000,
        "embedded metadata on S3: how long a metadata change waits for the bucket's copy of it, then "
        "UnavailableError (the change stays committed locally and is copied when the bucket answers)"),
    Key("s3.telemetry.metrics.exporter.uri", "metrics_exporter_uri", str, None, None,
        "prometheus://?host=127.0.0.1&port=9464 serves Prometheus metrics there (port 0: any free port); "
        "empty: metrics off (AutoMQ's key)"),
    Key("s3.telemetry.metrics.level", "metrics_level", str, None, None,
        "INFO: node-wide series; DEBUG adds per-stream series (label stream)", choices=("INFO", "DEBUG")),
    Key("s3.stream.set.object.compaction.interval.minutes", "stream_set_object_compaction_interval_minutes",
        int, 1, 100_000, "AutoMQ 5"),
    Key("s3.stream.set.object.compaction.cache.size", "stream_set_object_compaction_cache_size_bytes", int,
        1 * MiB, 1 << 40, "AutoMQ 200 MiB"),
    Key("s3.stream.set.object.compaction.stream.split.size",
        "stream_set_object_compaction_stream_split_size_bytes", int, 1, 1 << 40, "AutoMQ 8 MiB"),
    Key("s3.stream.set.object.compaction.force.split.minutes",
        "stream_set_object_compaction_force_split_minutes", int, 1, 1_000_000, "AutoMQ 120"),
    Key("s3.stream.set.object.compaction.max.num", "stream_set_object_compaction_max_num", int, 1, 100_000,
        "AutoMQ 500"),
    Key("s3.stream.object.compaction.interval.minutes", "stream_object_compaction_interval_minutes", int, 1,
        100_000, "AutoMQ library 60"),
    Key("s3.stream.object.compaction.max.size.bytes", "stream_object_compaction_max_size_bytes", int,
        1 * MiB, 1 << 50, "AutoMQ 10 GiB"),
    Key("s3.network.baseline.bandwidth", "network_baseline_bandwidth_bytes", int, 1 * MiB, 1 << 50,
        "AutoMQ 1.7.3 1 GiB/s"),
    Key("s3.cluster.poll.ms", "cluster_poll_ms", int, 1, 60_000,
        "how often a node polls stream assignments and takeovers (and the controller scans nodes); ours 100"),
    Key("s3.wal.failover.attach.cmd", "wal_failover_attach_cmd", str, None, None,
        "shell command a taker runs before opening a dead node's WAL ({node_id}, {wal_path} substituted); "
        "the last non-empty stdout line, if any, is the path to open; non-zero exit fails the attempt"),
    Key("s3.wal.failover.progress.leases", "wal_failover_progress_leases", int, 1, 1_000,
        "node leases a takeover attempt may go without reporting progress before the controller gives "
        "it to another node; ours 6"),
    Key("s3.wal.failover.run.failures.max", "wal_failover_run_failures_max", int, 1, 1_000,
        "failed runs of one takeover attempt after which the taker gives the attempt back; ours 3"),
    Key("s3.wal.failover.attempts.max", "wal_failover_attempts_max", int, 1, 1_000,
        "takeover attempts (across nodes) after which the takeover is FAILED: the slot is freed and the "
        "dead node may register again and replay its own WAL; ours 5"),
    Key("s3.data.buckets", "data_buckets", str, None, None,
        "bucket URIs 'N@s3://..,M@s3://..' (AutoMQ's form); used when open() names no bucket_uri; one "
        "entry: a single bucket as before"),
    Key("s3.data.buckets.strategy", "data_buckets_strategy", str, None, None,
        "where new objects go over several buckets", choices=("round_robin", "failover", "replication", "sharding")),
    Key("s3.data.buckets.weights", "data_buckets_weights", str, None, None,
        "sharding weights 'id:w,id:w' (every bucket id; ints >= 0, not all 0); the KV key "
        "__s3stream/buckets.weights overrides it while running"),
    Key("s3.data.buckets.failover.errors", "data_buckets_failover_errors", int, 1, 1_000,
        "errors or timeouts of a bucket within the window that mark it unhealthy; ours 3"),
    Key("s3.data.buckets.failover.window.ms", "data_buckets_failover_window_ms", int, 100, 3_600_000,
        "the window of s3.data.buckets.failover.errors; ours 10000"),
    Key("s3.data.buckets.probe.interval.ms", "data_buckets_probe_interval_ms", int, 10, 600_000,
        "how often an unhealthy or suspect bucket is probed (a small PUT); ours 1000"),
    Key("s3.data.buckets.probe.successes", "data_buckets_probe_successes", int, 1, 1_000,
        "consecutive successful probes that make an unhealthy bucket healthy again; ours 3"),
    Key("s3.data.buckets.request.timeout.ms", "data_buckets_request_timeout_ms", int, 100, 600_000,
        "per-attempt timeout of an S3 bucket's requests under several buckets (a URI's own "
        "apiCallAttemptTimeoutMs wins); the call deadline is twice it; ours 2000"),
    Key("s3.data.buckets.weights.poll.ms", "data_buckets_weights_poll_ms", int, 10, 600_000,
        "how often a node reads the live sharding weights from the metadata KV; ours 2000"),
    Key("s3.direct.prepared.ttl.ms", "direct_prepared_ttl_ms", int, 1, 7 * 86_400_000,
        "TTL of the object ids a direct write (the Spark sink's direct path) prepares: the longest its "
        "write pass may take before the commit (longer: the micro-batch fails, nothing committed); "
        "ids a crashed driver left expire after it and GC deletes their objects; ours 24 h"),
)  # fmt: skip
KEYS_BY_NAME = {name: key for key in KEYS for name in (key.name, *key.aliases)}
KEYS_BY_FIELD = {key.field: key for key in KEYS}
assert set(KEYS_BY_FIELD) == {f.name for f in dataclasses.fields(Config)}, "every field has exactly one key"

_SIZE = re.compile(r"^\s*([0-9]{1,30})\s*(b|kib|mib|gib|tib|kb|mb|gb|tb|k|m|g|t)?\s*$", re.IGNORECASE)
"""ASCII digits only (``\\d`` takes any script's digits); 30 digits is above every key's maximum and far
below the length ``int()`` refuses (4,300 digits: a bare ValueError)."""
_UNITS = {
    None: 1, "b": 1,
    "k": KiB, "kib": KiB, "kb": 1000,
    "m": MiB, "mib": MiB, "mb": 1000**2,
    "g": GiB, "gib": GiB, "gb": 1000**3,
    "t": 1 << 40, "tib": 1 << 40, "tb": 1000**4,
}  # fmt: skip


def env_var(name: str) -> str:
    """The environment variable of a key: ``s3.wal.capacity`` -> ``S3STREAM_S3_WAL_CAPACITY``."""
    return ENV_PREFIX + name.upper().replace(".", "_")


def _flatten(doc: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in doc.items():
        full = f"{prefix}{name}"
        if isinstance(value, dict):
            out.update(_flatten(value, full + "."))
        else:
            out[full] = value
    return out


def _parse(key: Key, raw: Any) -> Any:
    if key.kind is str:
        if not isinstance(raw, str):
            raise InvalidArgumentError(f"{key.name} must be a string, got {raw!r}")
        return raw
    if isinstance(raw, bool):
        raise InvalidArgumentError(f"{key.name} must be an integer, got {raw!r}")
    if isinstance(raw, int):
        return raw
    if isinstance(raw, str):
        match = _SIZE.match(raw)
        if match is None and raw.strip().isascii() and raw.strip().isdigit():
            raise InvalidArgumentError(
                f"{key.name} = {raw.strip()[:40]}... is above its maximum {key.maximum}"
            )
        if match is None:
            raise InvalidArgumentError(f"{key.name} must be an integer (optionally with a unit), got {raw!r}")
        unit = match.group(2).lower() if match.group(2) else None
        return int(match.group(1)) * _UNITS[unit]
    raise InvalidArgumentError(f"{key.name} must be an integer, got {raw!r}")


def _check(key: Key, value: Any) -> None:
    if key.kind is str:
        if not isinstance(value, str):
            raise InvalidArgumentError(f"{key.name} must be a string, got {value!r}")
        if key.choices and value not in key.choices:
            raise InvalidArgumentError(f"{key.name} must be one of {', '.join(key.choices)}, got {value!r}")
        if key.name == "s3.namespace" and not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", value):
            raise InvalidArgumentError(f"{key.name} must be 1-64 characters of [A-Za-z0-9._-], got {value!r}")
        if key.name in ("s3.data.buckets", "s3.data.buckets.weights") and value:
            from s3stream.buckets.spec import parse_bucket_list, parse_weights

            if key.name == "s3.data.buckets":
                parse_bucket_list(value)
            else:
                parse_weights(value)
        if key.name == "s3.metadata.url" and value:
            from s3stream.metadata.url import parse_metadata_url

            parse_metadata_url(value)
        if key.name == "s3.telemetry.metrics.exporter.uri":
            from s3stream.metrics.uri import parse_exporter_uri

            parse_exporter_uri(value)
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"{key.name} must be an integer, got {value!r}")
    if key.minimum is not None and value < key.minimum:
        raise InvalidArgumentError(f"{key.name} = {value} is below its minimum {key.minimum}")
    if key.maximum is not None and value > key.maximum:
        raise InvalidArgumentError(f"{key.name} = {value} is above its maximum {key.maximum}")
