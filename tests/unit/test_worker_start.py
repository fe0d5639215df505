"""The retry predicate the demo, the Spark tests and the benchmark share: only a late worker start."""

from __future__ import annotations

import pytest

from spark_sink.worker_start import WORKER_START_TIMEOUT_MESSAGES, is_worker_start_timeout

# The shape Spark reports (a StreamingQueryException's text carries the JVM's cause chain).
SPARK_TEXT = (
    "[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: "
    "org.apache.spark.SparkException: Python worker failed to connect back.\n"
    "\tat org.apache.spark.api.python.PythonWorkerFactory.createSimpleWorker(PythonWorkerFactory.scala:300)\n"
    "Caused by: java.net.SocketTimeoutException: Timed out while waiting for the Python worker to "
    "connect back"
)


def test_spark_worker_start_timeout_is_retried() -> None:
    assert is_worker_start_timeout(RuntimeError(SPARK_TEXT))


@pytest.mark.parametrize("message", WORKER_START_TIMEOUT_MESSAGES)
def test_each_message_alone_is_retried(message: str) -> None:
    assert is_worker_start_timeout(RuntimeError(f"java error: {message} after 10000 ms"))


def _raise_from_worker_timeout() -> None:
    try:
        raise OSError(WORKER_START_TIMEOUT_MESSAGES[0])
    except OSError as inner:
        raise RuntimeError("query failed") from inner


def test_a_cause_down_the_chain_is_retried() -> None:
    with pytest.raises(RuntimeError) as info:
        _raise_from_worker_timeout()
    assert is_worker_start_timeout(info.value)


@pytest.mark.parametrize(
    "text",
    [
        "Python worker exited unexpectedly (crashed)",
        "Python daemon failed to launch worker",
        "ConflictError: micro-batch 3: partition 0 of topic 't' ends at offset 10",
        "Python worker failed",
        "",
    ],
)
def test_other_failures_are_not_retried(text: str) -> None:
    assert not is_worker_start_timeout(RuntimeError(text))


def test_a_cycle_in_the_cause_chain_ends() -> None:
    a, b = RuntimeError("a"), RuntimeError("b")
    a.__cause__, b.__cause__ = b, a
    assert not is_worker_start_timeout(a)
