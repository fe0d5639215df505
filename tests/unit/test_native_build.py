"""The compiled codec (s3stream._native) is built in this checkout and used unless forced off.

CI runs the suite once with the extension and the codec tests again with ``S3STREAM_PURE_PYTHON=1``
(scripts/test); this file makes a build that silently fell back to pure Python fail the first run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass

import pytest

from s3stream import native
from s3stream.native import NATIVE, PURE_PYTHON_ENV, compiled_module, pure_python_forced


def test_the_extension_is_built_and_in_use_unless_pure_python_is_forced() -> None:
    if pure_python_forced():
        assert NATIVE is None
        return
    assert compiled_module() is not None, (
        "s3stream._native is not built: run `pip install -e .` (scripts/bootstrap) with a C compiler"
    )
    assert NATIVE is not None


def _native_in_use(env_value: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != PURE_PYTHON_ENV}
    if env_value is not None:
        env[PURE_PYTHON_ENV] = env_value
    code = (
        "import os; from s3stream import native; "
        f"os.environ[{PURE_PYTHON_ENV!r}] = '1' if native.NATIVE is not None else '0'; "  # read once only
        "from s3stream.objectformat import block, decode, writer; "
        "print(native.NATIVE is not None, block.NATIVE is native.NATIVE, writer.NATIVE is native.NATIVE)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, timeout=60
    )
    return done.stdout.strip()


def test_the_environment_variable_forces_pure_python_when_read_at_import() -> None:
    assert _native_in_use("1") == "False True True"
    assert _native_in_use("0") == ("True True True" if compiled_module() is not None else "False True True")


def test_configure_needs_the_record_slots() -> None:
    module = compiled_module()
    if module is None:
        assert pure_python_forced(), "s3stream._native is not built"
        return

    @dataclass(frozen=True)
    class NoSlots:
        stream_id: int

    with pytest.raises(TypeError, match="is not a slot"):
        module.configure(NoSlots)  # type: ignore[arg-type]
    assert native.NATIVE is None or native.NATIVE is module
