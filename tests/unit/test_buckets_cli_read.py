"""The read commands on a data dir whose objects are spread over two buckets: ``fetch`` follows the
recorded placement (the bucket list comes from the storage record)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from s3stream.assembly import open_client
from s3stream.cli import main
from s3stream.config import Config
from s3stream.storage.local import LocalObjectStorage
from tests.support.buckets_e2e import CONFIG, ingest, read_all


async def write(data_dir: Path, buckets: str, config: Config) -> list[int]:
    client = await open_client(data_dir, bucket_uri=buckets, config=config)
    try:
        stream = await client.streams.create_and_open_stream()
        await ingest(client, [stream], 4)
        return [offset for offset, _ in await read_all(stream)]
    finally:
        await client.close()


async def keys(root: Path) -> list[str]:
    return [info.key async for info in LocalObjectStorage(str(root)).list("")]


def test_fetch_reads_records_from_both_buckets(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    buckets = f"0@file://{tmp_path}/b0,1@file://{tmp_path}/b1"
    data_dir = tmp_path / "data"
    config: Config = CONFIG.replace(data_buckets_strategy="round_robin")
    expected = asyncio.run(write(data_dir, buckets, config))
    for b in (0, 1):  # the records really are spread over both
        assert asyncio.run(keys(tmp_path / f"b{b}"))
    toml = tmp_path / "s3stream.toml"
    toml.write_text(f'"s3.namespace" = "{config.namespace}"\n')
    argv = ["fetch", "--data-dir", str(data_dir), "--config", str(toml), "--stream", "0", "--json"]
    assert main(argv) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [row["offset"] for row in rows] == expected


def test_the_spark_sink_takes_the_driver_path_over_several_buckets(tmp_path: Path) -> None:
    from s3stream.assembly import open_sync
    from s3stream.errors import InvalidArgumentError
    from spark_sink.direct import direct_target

    buckets = f"0@file://{tmp_path}/b0,1@file://{tmp_path}/b1"
    client = open_sync(tmp_path / "data", bucket_uri=buckets, config=CONFIG)
    try:
        assert direct_target(client, None, None) is None  # executors could not record placement
        with pytest.raises(InvalidArgumentError, match="several buckets"):
            direct_target(client, None, True)
    finally:
        client.close()
