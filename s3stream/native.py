"""Which implementation of the codec hot paths runs: the compiled ``s3stream._native`` or pure Python.

The extension is built by the package's own build (``setup.py``, optional: an install without a C
compiler still works) and used automatically when it imports. ``S3STREAM_PURE_PYTHON=1`` (read once,
when this module is first imported) forces the pure-Python codecs even where it is built.

Contract (see ``s3stream/_native.c``): a compiled function returns exactly what the Python code
returns for the same input, or None to let the Python code decide; errors are always raised by the
Python code, so both implementations raise the same type, message and position.
"""

from __future__ import annotations

import os
from types import ModuleType

from s3stream.record import StreamRecordBatch

PURE_PYTHON_ENV = "S3STREAM_PURE_PYTHON"
"""Set to anything but empty or ``0`` to use the pure-Python codecs even where the extension is built."""


def pure_python_forced() -> bool:
    """Whether the environment forces the pure-Python codecs (as read now)."""
    return os.environ.get(PURE_PYTHON_ENV, "") not in ("", "0")


def _load() -> ModuleType | None:
    if pure_python_forced():
        return None
    try:
        from s3stream import _native
    except ImportError:
        return None
    _native.configure(StreamRecordBatch)
    return _native


NATIVE = _load()
"""The configured extension module, or None (not built, or forced off by :data:`PURE_PYTHON_ENV`)."""


def compiled_module() -> ModuleType | None:
    """The extension module if it is built in this installation (configured), whether or not used."""
    try:
        from s3stream import _native
    except ImportError:
        return None
    _native.configure(StreamRecordBatch)
    return _native
