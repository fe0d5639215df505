"""The ``s3stream`` command line: a dispatcher over subcommand modules in this package.

Each module ``s3stream/cli/<name>.py`` exposes ``register(subparsers)``, adding its subcommands
with ``set_defaults(func=...)``; ``func(args) -> int`` is the exit code. Every subcommand takes
``--metadata-url`` (:mod:`s3stream.cli._metadata`). Errors of s3stream become a one-line message and
exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence

from s3stream.cli._metadata import add_metadata_url_everywhere, check_metadata_url
from s3stream.errors import S3StreamError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="s3stream", description=__doc__.splitlines()[0] if __doc__ else None
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
    try:
        check_metadata_url(args)
        code: int = args.func(args)
    except S3StreamError as exc:
        print(f"s3stream {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
