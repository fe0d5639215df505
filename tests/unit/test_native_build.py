"""The compiled codec (s3stream._native) is built in this checkout and used unless forced off.

CI runs the suite once with the extension and the codec tests again with ``S3STREAM_PURE_PYTHON=1``
(scripts/test); this file makes a build that silently fell back to pure Python fail the first run.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType

import pytest

from s3stream import native
from s3stream.native import NATIVE, PURE_PYTHON_ENV, compiled_module, pure_python_forced
from s3stream.objectformat.block import decode_block, encode_block
from s3stream.objectformat.codec import IndexEntry
from s3stream.record import StreamRecordBatch


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


@pytest.fixture
def module() -> Iterator[ModuleType]:
    """The compiled module, configured again with StreamRecordBatch after the test."""
    built = compiled_module()
    if built is None:
        assert pure_python_forced(), "s3stream._native is not built"
        pytest.skip("the compiled codec is forced off (S3STREAM_PURE_PYTHON)")
    try:
        yield built
    finally:
        built.configure(StreamRecordBatch)


_SLOT_NAMES = ("stream_id", "epoch", "base_offset", "count", "payload")


class _WithDict(StreamRecordBatch):
    """The record class with a __dict__ (no __slots__ of its own)."""


class _BorrowedSlots:
    """Slotted, and the record's five member descriptors as class attributes: their offsets are
    StreamRecordBatch's, not this class's."""

    __slots__ = ("a", "b", "c", "d", "e", "f", "g")


class _NotCollected:
    """No slots of its own (so no cycle-collector support) and the record's descriptors."""

    __slots__ = ()


for _name in _SLOT_NAMES:
    _descriptor = next(c.__dict__[_name] for c in StreamRecordBatch.__mro__ if _name in c.__dict__)
    setattr(_BorrowedSlots, _name, _descriptor)
    setattr(_NotCollected, _name, _descriptor)


@pytest.mark.parametrize("cls", [_WithDict, _BorrowedSlots, _NotCollected])
def test_configure_refuses_classes_whose_instances_it_cannot_build(module: ModuleType, cls: type) -> None:
    """Only a GC class without __dict__ whose five slots belong to it or its bases is taken; a
    refusal leaves the configured class as it was."""
    with pytest.raises(TypeError):
        module.configure(cls)
    records = [StreamRecordBatch(1, 0, 0, 1, b"ab")]
    block = encode_block(records)
    decoded = decode_block(block, 0, IndexEntry(1, 0, 1, 1, 0, len(block)), source="obj")
    assert decoded == tuple(records)
    assert type(decoded[0]) is StreamRecordBatch


class _Child(StreamRecordBatch):
    __slots__ = ()


class _GrandChild(_Child):
    __slots__ = ()


def test_configure_finds_slots_through_the_whole_mro(module: ModuleType) -> None:
    """The slots two levels up are found (a lookup one base deep missed them)."""
    module.configure(_GrandChild)
    records = [StreamRecordBatch(3, 1, 5, 2, b"xyz")]
    block = encode_block(records)
    decoded = module.decode_block(block, 0, 3, 5, 7, 1, len(block), False)
    assert decoded is not None
    assert type(decoded[0][0]) is _GrandChild
    assert (decoded[0][0].stream_id, decoded[0][0].base_offset, decoded[0][0].payload) == (3, 5, b"xyz")


def test_a_record_class_the_build_refuses_falls_back_to_pure_python(
    module: ModuleType, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A StreamRecordBatch that changed shape since the extension was built: pure Python and a
    warning, not a failed import."""

    @dataclass(frozen=True)
    class Reshaped:
        stream_id: int

    monkeypatch.setattr(native, "StreamRecordBatch", Reshaped)
    monkeypatch.delenv(PURE_PYTHON_ENV, raising=False)  # _load reads it
    with caplog.at_level(logging.WARNING, logger="s3stream.native"):
        assert native.compiled_module() is None
        assert native._load() is None
    assert [r.getMessage().split()[0] for r in caplog.records] == ["native.configure_failed"] * 2
    assert 'error="TypeError: Reshaped is not a slotted class' in caplog.records[0].getMessage()
