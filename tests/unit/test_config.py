"""Config: defaults, limits naming the key, TOML and environment loading, precedence."""

from __future__ import annotations

from pathlib import Path

import pytest

from s3stream.config import KEYS, Config, env_var
from s3stream.errors import InvalidArgumentError

MiB = 1024 * 1024


def test_defaults_are_valid_and_every_field_has_an_automq_key() -> None:
    config = Config()
    keys = config.as_keys()
    for name in (
        "s3.wal.capacity",
        "s3.wal.upload.threshold",
        "s3.wal.upload.interval.ms",
        "s3.wal.cache.size",
        "s3.block.cache.size",
        "s3.object.block.size",
        "s3.object.part.size",
        "s3.stream.object.split.size",
        "s3.max.stream.num.per.stream.set.object",
        "s3.max.stream.object.num.per.commit",
        "s3.object.delete.retention.minutes",
        "s3.stream.set.object.compaction.interval.minutes",
        "s3.stream.object.compaction.max.size.bytes",
    ):
        assert name in keys
    assert keys["s3.stream.object.split.size"] == 8 * MiB


@pytest.mark.parametrize(
    ("field", "value", "key"),
    [
        ("object_part_size_bytes", 4 * MiB, "s3.object.part.size"),
        ("wal_capacity_bytes", 1024, "s3.wal.capacity"),
        ("node_id", -1, "s3.node.id"),
        ("wal_upload_interval_ms", 0, "s3.wal.upload.interval.ms"),
        ("namespace", "bad/ns", "s3.namespace"),
        ("wal_thread_count", True, "s3.wal.thread"),
    ],
)
def test_out_of_range_values_name_the_key(field: str, value: object, key: str) -> None:
    with pytest.raises(InvalidArgumentError, match=key.replace(".", r"\.")):
        Config(**{field: value})  # type: ignore[arg-type]


def test_relations_between_keys_are_checked() -> None:
    with pytest.raises(InvalidArgumentError, match=r"s3\.wal\.upload\.threshold"):
        Config(wal_cache_size_bytes=8 * MiB, wal_upload_threshold_bytes=16 * MiB)
    with pytest.raises(InvalidArgumentError, match=r"s3\.wal\.record\.size\.max"):
        Config(wal_capacity_bytes=16 * MiB, wal_record_max_bytes=8 * MiB, record_max_bytes=1 * MiB)


def test_toml_then_env_then_overrides(tmp_path: Path) -> None:
    path = tmp_path / "s3stream.toml"
    path.write_text(
        '"s3.wal.cache.size" = "64MiB"\n'
        '"s3.wal.upload.threshold" = 4194304\n'
        "[s3.object]\nblock.size = 65536\n"
        "[node]\nid = 3\n"
    )
    env = {env_var("s3.wal.upload.threshold"): "8MiB", "UNRELATED": "x"}
    config = Config.from_sources(path, env=env, node_id=7)
    assert config.wal_cache_size_bytes == 64 * MiB
    assert config.wal_upload_threshold_bytes == 8 * MiB  # env wins over the file
    assert config.object_block_size_bytes == 65536
    assert config.node_id == 7  # override wins
    assert env_var("s3.wal.capacity") == "S3STREAM_S3_WAL_CAPACITY"


def test_bad_sources_raise_invalid_argument(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("this is = = not toml")
    with pytest.raises(InvalidArgumentError, match="not valid TOML"):
        Config.from_sources(bad, env={})
    unknown = tmp_path / "unknown.toml"
    unknown.write_text('"s3.no.such.key" = 1\n')
    with pytest.raises(InvalidArgumentError, match="unknown config key"):
        Config.from_sources(unknown, env={})
    with pytest.raises(InvalidArgumentError, match="cannot read"):
        Config.from_sources(tmp_path / "missing.toml", env={})
    with pytest.raises(InvalidArgumentError, match=r"s3\.wal\.capacity"):
        Config.from_sources(env={env_var("s3.wal.capacity"): "lots"})
    with pytest.raises(InvalidArgumentError, match="unknown config field"):
        Config.from_sources(env={}, no_such_field=1)


def test_keys_are_unique_and_have_docs() -> None:
    assert len({k.name for k in KEYS}) == len(KEYS)
    assert all(k.doc for k in KEYS)


def test_wal_aio_is_adaptive_by_default_and_loads_auto_from_toml_and_env(tmp_path: Path) -> None:
    assert Config().wal_aio == "adaptive"
    assert Config().as_keys()["s3.wal.aio"] == "adaptive"
    path = tmp_path / "s3stream.toml"
    path.write_text('[s3.wal]\naio = "auto"\n')
    assert Config.from_sources(path, env={}).wal_aio == "auto"
    assert Config.from_sources(env={env_var("s3.wal.aio"): "auto"}).wal_aio == "auto"
    assert Config.from_sources(path, env={env_var("s3.wal.aio"): "off"}).wal_aio == "off"  # env wins


@pytest.mark.parametrize("value", ["on", "AUTO", "", 1, True])
def test_wal_aio_refuses_anything_but_its_write_paths(value: object) -> None:
    with pytest.raises(InvalidArgumentError, match=r"s3\.wal\.aio"):
        Config(wal_aio=value)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match=r"s3\.wal\.aio"):
        Config.from_sources(env={}, wal_aio=value)
