"""The ``s3stream`` command line: a dispatcher over subcommand modules in this package.

Each module ``s3stream/cli/<name>.py`` exposes ``register(subparsers)``, adding its subcommands
with ``set_defaults(func=...)``; ``func(args) -> int`` is the exit code. Every subcommand takes
``--metadata-url`` (:mod:`s3stream.cli._metadata`). Errors of s3stream become a one-line message and
exit code 2, never a traceback.

Logging (before the subcommand): ``--log-format kv|plain`` (default ``kv``, or
``$S3STREAM_LOG_FORMAT``) and ``--log-level`` (default ``warning``, or ``$S3STREAM_LOG_LEVEL``): one
stderr handler with the redaction filter (:mod:`s3stream.logfmt`), so no credential reaches a line.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import pkgutil
import sys
from collections.abc import Sequence

from s3stream.cli._metadata import add_metadata_url_everywhere, check_metadata_url
from s3stream.errors import S3StreamError
from s3stream.logfmt import LOG_FORMATS, redact, setup_logging

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="s3stream", description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default=os.environ.get("S3STREAM_LOG_FORMAT", "kv"),
        help="log lines as key=value pairs (kv, default) or plain text; $S3STREAM_LOG_FORMAT",
    )
    parser.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        type=str.lower,
        default=os.environ.get("S3STREAM_LOG_LEVEL", "warning").lower(),
        help="lowest level logged to stderr (default warning); $S3STREAM_LOG_LEVEL",
    )
    subparsers = parser.add_subparsers(dest="command", required=True)
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        module.register(subparsers)
    add_metadata_url_everywhere(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.log_format not in LOG_FORMATS or args.log_level not in LOG_LEVELS:
        parser.error(f"--log-format must be one of {LOG_FORMATS}, --log-level one of {LOG_LEVELS}")
    root = logging.getLogger()
    root_level = root.level
    handler = setup_logging(args.log_format, args.log_level)
    try:
        check_metadata_url(args)
        code: int = args.func(args)
    except S3StreamError as exc:
        print(f"s3stream {args.command}: error: {redact(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    finally:  # main() also runs inside tests: leave the process's logging as it was
        root.removeHandler(handler)
        root.setLevel(root_level)
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
