"""Which metadata store a CLI command uses: the ``--metadata-url`` option, and its read-only opening.

Every command takes ``--metadata-url URL`` (one option, added here to every subcommand parser). It
overrides ``s3.metadata.url`` from ``--config`` and the environment; without it a command uses that
key, and an empty key is the data dir's ``metadata.db`` as before. Commands that read no metadata
(``inspect object``) accept it (a bad URL is refused all the same) and do not use it, so scripts can
pass it to every command.

The read commands (``streams``, ``objects``, ``fetch``, ``nodes``) never write the store they read:

* SQLite (the data dir's file, or a ``sqlite:`` URL): the one read-only SQLite access
  (:mod:`s3stream.metadata.sqlite_readonly`: nothing written, no file created);
* PostgreSQL: a session whose every transaction is read-only (libpq
  ``options=-c default_transaction_read_only=on`` added to the URL): the server refuses any write.

With a metadata URL the data dir is optional: objects come from the storage recorded in the metadata
(or ``--bucket-uri``), and the records still in a WAL are shown only when ``--data-dir`` names the
data dir holding that WAL.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import cast

from s3stream.binding import LOCAL_OBJECTS_DIR, recorded_storage_of, storage_to_open
from s3stream.cli._readonly import ReadOnlyView
from s3stream.clock import Clock, wall_clock_ms
from s3stream.config import Config
from s3stream.errors import InvalidArgumentError, NotFoundError
from s3stream.metadata.base import MetadataStore
from s3stream.metadata.store import TransactionalStore
from s3stream.metadata.url import MetadataURL, open_metadata_store, parse_metadata_url

OPTION = "--metadata-url"
_HELP_USED = (
    "metadata store: sqlite:///path/metadata.db or postgresql://user:pass@host:port/db; overrides "
    "s3.metadata.url (--config, $S3STREAM_S3_METADATA_URL); default: <data-dir>/metadata.db"
)
_HELP_UNUSED = "accepted so scripts can pass it to every command; unused by this command"


def add_metadata_url_arg(parser: argparse.ArgumentParser, *, used: bool = True) -> None:
    """Add ``--metadata-url`` to ``parser`` (``used``: the command reads or writes metadata)."""
    parser.add_argument(
        OPTION, dest="metadata_url", default=None, metavar="URL", help=_HELP_USED if used else _HELP_UNUSED
    )


def add_metadata_url_everywhere(parser: argparse.ArgumentParser) -> None:
    """Give every subcommand below ``parser`` that has no ``--metadata-url`` yet the unused one."""
    subcommands = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    if not subcommands:
        if OPTION not in parser._option_string_actions:
            add_metadata_url_arg(parser, used=False)
        return
    for action in subcommands:
        for child in dict.fromkeys(action.choices.values()):  # aliases share a parser
            add_metadata_url_everywhere(child)


def check_metadata_url(args: argparse.Namespace) -> None:
    """Refuse a bad ``--metadata-url`` before any command runs, the commands that ignore it too
    (InvalidArgumentError without the URL's password). An empty one means ``s3.metadata.url``'s
    default, the data dir's ``metadata.db``."""
    url = getattr(args, "metadata_url", None)
    if url:
        parse_metadata_url(url)


def command_config(args: argparse.Namespace) -> Config:
    """The command's configuration: ``--config``, the environment, ``-c KEY=VALUE`` settings, then
    ``--metadata-url`` (checked: a bad URL is an InvalidArgumentError naming what is wrong, without
    its password)."""
    overrides: dict[str, str] = dict(parse_settings(getattr(args, "settings", None) or ()))
    url = getattr(args, "metadata_url", None)
    if url is not None:
        overrides["metadata_url"] = url
    return Config.from_sources(args.config, env=None, **overrides)


def parse_settings(settings: Sequence[str]) -> list[tuple[str, str]]:
    """``-c KEY=VALUE`` settings as (key, value) pairs, in order (a later one of a key wins); the key is
    an AutoMQ key name (``s3.node.id``), checked by the Config. InvalidArgumentError without ``=``."""
    pairs = []
    for setting in settings:
        key, sep, value = setting.partition("=")
        if not sep or not key.strip():
            raise InvalidArgumentError(f"-c takes KEY=VALUE (e.g. -c s3.node.id=1), got {setting!r}")
        pairs.append((key.strip(), value.strip()))
    return pairs


async def open_metadata_read_only(url: MetadataURL) -> MetadataStore:
    """The store ``url`` names, opened so that nothing can be written through it."""
    return cast(MetadataStore, await open_metadata_store(url, read_only=True))


async def open_read_view(args: argparse.Namespace, *, objects_needed: bool = False) -> ReadOnlyView:
    """The read-only view a read command works on: the data dir's own metadata, or the store of
    ``--metadata-url`` / ``s3.metadata.url`` (then ``--data-dir`` is optional). ``objects_needed``:
    refuse (NotFoundError) when no object storage can be found for the metadata."""
    config = command_config(args)
    if not config.metadata_url:
        return await ReadOnlyView.open(args.data_dir, bucket_uri=args.bucket_uri, config=config)
    metadata = await open_metadata_read_only(parse_metadata_url(config.metadata_url))
    if objects_needed:
        try:
            await _check_objects_found(metadata, args, config)
        except BaseException:
            await metadata.close()
            raise
    return await ReadOnlyView.open(
        args.data_dir, bucket_uri=args.bucket_uri, config=config, metadata=metadata
    )


async def _check_objects_found(metadata: MetadataStore, args: argparse.Namespace, config: Config) -> None:
    recorded = await recorded_storage_of(metadata)
    where = storage_to_open(recorded, args.bucket_uri, namespace=config.namespace)
    local = Path(args.data_dir) / LOCAL_OBJECTS_DIR
    if where is None and not await asyncio.to_thread(local.is_dir):
        raise NotFoundError(
            "no object storage found for this metadata: it records none, or a data dir's own "
            f"{LOCAL_OBJECTS_DIR}/ folder, and there is none at {local}: give --bucket-uri or --data-dir"
        )


def store_clock(metadata: MetadataStore) -> Clock:
    """The clock the store compares leases with (a PostgreSQL store's is the server's), else this
    machine's wall clock."""
    if isinstance(metadata, TransactionalStore):
        return metadata._clock_ms
    return wall_clock_ms
