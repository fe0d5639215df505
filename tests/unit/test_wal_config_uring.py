"""The io_uring write path's setting: ``WalConfig.aio="uring"`` and the engine key ``s3.wal.aio``."""

from __future__ import annotations

from pathlib import Path

import pytest

from s3stream.config import Config, env_var
from wal import InvalidWalConfig, WalConfig


def test_the_wal_takes_uring_and_still_refuses_other_values() -> None:
    assert WalConfig(aio="uring").aio == "uring"
    assert WalConfig().aio == "off"
    with pytest.raises(InvalidWalConfig, match="'auto', 'uring', 'adaptive' or 'off'"):
        WalConfig(aio="io_uring")  # type: ignore[arg-type]


def test_the_engine_key_loads_uring_from_toml_and_env(tmp_path: Path) -> None:
    path = tmp_path / "s3stream.toml"
    path.write_text('[s3.wal]\naio = "uring"\n')
    assert Config.from_sources(path, env={}).wal_aio == "uring"
    assert Config.from_sources(env={env_var("s3.wal.aio"): "uring"}).wal_aio == "uring"
    assert Config().wal_aio == "off"
