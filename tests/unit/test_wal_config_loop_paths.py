"""The loop write paths' settings: ``WalConfig.aio`` = "uring" / "adaptive" and the engine key ``s3.wal.aio``."""

from __future__ import annotations

from pathlib import Path

import pytest

from s3stream.config import Config, env_var
from wal import InvalidWalConfig, WalConfig


@pytest.mark.parametrize(("value", "near_miss"), [("uring", "io_uring"), ("adaptive", "adapt")])
def test_the_wal_takes_the_setting_and_still_refuses_other_values(value: str, near_miss: str) -> None:
    assert WalConfig(aio=value).aio == value  # type: ignore[arg-type]
    assert WalConfig().aio == "adaptive"  # (the default)
    with pytest.raises(InvalidWalConfig, match="'auto', 'uring', 'adaptive' or 'off'"):
        WalConfig(aio=near_miss)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["uring", "adaptive"])
def test_the_engine_key_loads_the_setting_from_toml_and_env(tmp_path: Path, value: str) -> None:
    path = tmp_path / "s3stream.toml"
    path.write_text(f'[s3.wal]\naio = "{value}"\n')
    assert Config.from_sources(path, env={}).wal_aio == value
    assert Config.from_sources(env={env_var("s3.wal.aio"): value}).wal_aio == value
    assert Config().wal_aio == "adaptive"  # (the default)
