"""``python -m spark_sink abandon``: show, then discard, what a topic holds past its committed ends.

    python -m spark_sink abandon --data-dir DIR --topic T [--dry-run] [--query-id Q] [--json]
                                 [--bucket-uri URI] [--config FILE.toml]

The engine options are those of the ``s3stream`` commands (``--data-dir`` is the directory the sink
was given, e.g. ``<demo dir>/engine``). Exit codes: 0 discarded (or, with ``--dry-run``, something
to discard), 1 nothing to discard, 2 an s3stream error (e.g. the data dir is in use by a sink).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import TextIO

from s3stream.cli.streams import add_engine_args, print_rows
from s3stream.config import Config
from s3stream.errors import S3StreamError
from spark_sink.abandon import AbandonPlan, NothingToDiscardError, abandon_unfinished

COLUMNS = ("partition", "stream_id", "committed_end", "stream_end", "discard_records", "discard_range")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m spark_sink", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    abandon = sub.add_parser(
        "abandon",
        help="discard the records past a topic's committed ends and abandon its unfinished micro-batch",
    )
    add_engine_args(abandon)
    abandon.add_argument("--topic", required=True, help="the sink's topic")
    abandon.add_argument(
        "--dry-run", action="store_true", help="show what would be discarded, change nothing"
    )
    abandon.add_argument(
        "--query-id",
        default=None,
        help="the streaming query of the unfinished micro-batch (default: the one the topic's records name)",
    )
    return parser


def print_plan(plan: AbandonPlan, *, dry_run: bool, as_json: bool, out: TextIO) -> None:
    if as_json:
        json.dump({**plan.to_dict(), "dry_run": dry_run}, out)
        out.write("\n")
        return
    out.write(f"topic {plan.topic!r}: {plan.discard_count} record(s) past the committed ends\n")
    rows = []
    for row in plan.to_dict()["partitions"]:
        r = row["discard_range"]
        rows.append({**row, "discard_range": "-" if r is None else f"[{r[0]}, {r[1]})"})
    print_rows(rows, COLUMNS, as_json=False, out=out)
    if plan.progress is not None:
        p = plan.progress
        out.write(
            f"unfinished micro-batch: query {plan.query_id} batch {p.batch_id}, {p.chunks_done} of "
            f"{p.chunk_count} chunks committed; its replay will be refused\n"
        )
    else:
        out.write(
            "no unfinished micro-batch found (records appended outside the sink, or by a query "
            "unnamed here: pass --query-id to refuse its replay too)\n"
        )
    if dry_run:
        out.write("dry run: nothing changed\n")
    else:
        out.write(
            "discarded: the committed ends moved past these ranges; readers skip them; the topic takes writes\n"
        )


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    args = build_parser().parse_args(argv)
    try:
        plan = abandon_unfinished(
            args.data_dir,
            args.topic,
            query_id=args.query_id,
            dry_run=args.dry_run,
            bucket_uri=args.bucket_uri,
            config=Config.from_sources(args.config),
        )
    except NothingToDiscardError as exc:
        print(f"spark_sink {args.command}: {exc}", file=sys.stderr)
        return 1
    except S3StreamError as exc:
        print(f"spark_sink {args.command}: error: {exc}", file=sys.stderr)
        return 2
    print_plan(plan, dry_run=args.dry_run, as_json=args.json, out=out)
    return 0
