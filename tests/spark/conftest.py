"""One SparkSession for the whole Spark suite (cold start 5-12 s); skips without Java/pyspark."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest


def _spark_missing() -> str | None:
    try:
        import pyarrow  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError as exc:
        return f"pyspark/pyarrow not installed: {exc}"
    if shutil.which("java") is None:
        return "no java on PATH"
    return None


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    reason = _spark_missing()
    if reason is not None:
        if os.environ.get("S3STREAM_REQUIRE_SPARK") == "1":
            pytest.fail(f"S3STREAM_REQUIRE_SPARK=1 but {reason}")
        pytest.skip(reason)
    from spark_sink.session import local_session

    session = local_session("s3stream-tests")
    yield session
    session.stop()
