"""``s3stream restore``: rebuild a data dir's metadata from its copy in the bucket (after a lost disk).

Writes ``<data-dir>/metadata.db`` (the newest readable snapshot of the copy plus the log objects after
it) into a new or empty directory, records the bucket as the data dir's object storage, and prints
the last commit it restored and what the database holds. The data dir then opens as any other; its
WAL is new (acknowledged records that were only in the lost WAL are not in the bucket).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from s3stream._loop import run
from s3stream.binding import STORAGE_BOUND_KEY, RecordedStorage, open_storage, without_secrets
from s3stream.buckets.spec import is_bucket_list, parse_bucket_list
from s3stream.config import Config
from s3stream.errors import InvalidArgumentError
from s3stream.metacopy.restore import METADATA_FILE, RestoreReport, restore
from s3stream.metadata.url import default_metadata_url, parse_metadata_url
from s3stream.storage.uri import parse_bucket_uri


def _check_metadata_url(url: str, data_dir: str) -> None:
    """Restore writes the embedded SQLite store of ``data_dir``; any other metadata URL is refused."""
    parsed = parse_metadata_url(url)
    if not parsed.is_sqlite:
        raise InvalidArgumentError(
            f"restore rebuilds the embedded SQLite metadata of a data dir; {parsed.describe()} is shared "
            "metadata that keeps its own durable copy (nothing to restore from the bucket)"
        )
    wanted = parse_metadata_url(default_metadata_url(data_dir)).sqlite_path
    if os.path.abspath(parsed.sqlite_path) != wanted:
        raise InvalidArgumentError(
            f"restore writes {wanted}; --metadata-url names {parsed.sqlite_path} (leave it out, or name that file)"
        )


def _protocol(bucket_uri: str) -> str:
    """The protocol of a bucket URI, or of a bucket list's entries (all s3, or none)."""
    if is_bucket_list(bucket_uri):
        return parse_bucket_list(bucket_uri)[0].protocol
    return parse_bucket_uri(bucket_uri).protocol


async def _restore(args: argparse.Namespace) -> RestoreReport:
    config = Config.from_sources(args.config)
    if _protocol(args.bucket_uri) != "s3":
        raise InvalidArgumentError(
            f"the metadata copy is kept in S3 buckets only; {without_secrets(args.bucket_uri)!r} is not one"
        )
    url = args.metadata_url or config.metadata_url
    if url:
        _check_metadata_url(url, args.data_dir)
    record = RecordedStorage(without_secrets(args.bucket_uri), config.namespace, checked=True)
    storage = await open_storage(Path(args.data_dir), args.bucket_uri, config)
    try:
        return await restore(
            storage,
            namespace=config.namespace,
            data_dir=args.data_dir,
            copy_id=args.copy_id,
            kv_overrides={STORAGE_BOUND_KEY: record.encode()},
        )
    finally:
        await storage.close()


def _when(ms: int) -> str:
    if ms < 0:
        return "unknown"
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


def _print(report: RestoreReport, as_json: bool) -> None:
    if as_json:
        fields: dict[str, Any] = dataclasses.asdict(report)
        fields["last_commit_time"] = _when(report.last_commit_ms)
        json.dump(fields, sys.stdout)
        sys.stdout.write("\n")
        return
    out = sys.stdout
    out.write(f"restored {report.database} from metadata copy {report.copy_id}\n")
    out.write(f"last commit restored: group {report.last_seq} at {_when(report.last_commit_ms)}\n")
    out.write(
        f"from snapshot {report.snapshot_key} (group {report.snapshot_seq}) and "
        f"{report.log_objects_applied} log objects after it\n"
    )
    out.write(
        f"streams {report.streams}, committed objects {report.committed_objects}, KV pairs {report.kv_pairs}\n"
    )
    if report.stopped is not None:
        out.write(f"stopped early: {report.stopped}; later commits are not restored\n")
    for skipped in report.skipped:
        out.write(f"skipped (failed its checks): {skipped}\n")
    if report.other_copies:
        out.write(
            f"other copies in this namespace (--copy-id to restore one): {', '.join(report.other_copies)}\n"
        )


def _command(args: argparse.Namespace) -> int:
    report = run(_restore(args))
    _print(report, args.json)
    return 1 if report.stopped is not None else 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "restore",
        help="rebuild a data dir's metadata from its copy in the bucket (after the data dir was lost)",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    parser.add_argument(
        "--bucket-uri", required=True, help="the bucket the lost data dir used (an s3:// URI)"
    )
    parser.add_argument(
        "--data-dir",
        required=True,
        help=f"a new or empty directory: receives {METADATA_FILE} (never overwritten)",
    )
    parser.add_argument(
        "--config", default=None, metavar="FILE.toml", help="configuration file (s3.namespace names the copy)"
    )
    parser.add_argument(
        "--metadata-url",
        default=None,
        help="accepted for symmetry: only the data dir's own sqlite:///<data-dir>/metadata.db",
    )
    parser.add_argument("--copy-id", default=None, help="restore this copy (default: the one written last)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.set_defaults(func=_command)
