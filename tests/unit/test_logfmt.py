"""The key=value log lines, ``log_event`` and the redaction filter (s3stream.logfmt)."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest

from s3stream.cli import main
from s3stream.logfmt import (
    EVENT_ATTR,
    FIELDS_ATTR,
    SetupHandler,
    format_value,
    log_event,
    redact,
    register_secret,
    setup_logging,
)

LOGGER = "s3stream.test.logfmt"


@pytest.fixture
def kv_stream() -> Iterator[io.StringIO]:
    """The CLI's logging setup (kv, DEBUG) writing to a string; the root logger restored after."""
    root = logging.getLogger()
    level = root.level
    stream = io.StringIO()
    handler = setup_logging("kv", logging.DEBUG, stream)
    # only this test's logger: a background task another test left running (a GC loop) may log too
    handler.addFilter(logging.Filter(LOGGER))
    yield stream
    root.removeHandler(handler)
    root.setLevel(level)


def _fields(line: str) -> dict[str, str]:
    """A kv line parsed back (values with quotes unescaped): the reader an operator's tool would use."""
    out: dict[str, str] = {}
    i = 0
    while i < len(line):
        eq = line.index("=", i)
        key = line[i:eq]
        i = eq + 1
        if i < len(line) and line[i] == '"':
            i += 1
            value = []
            while line[i] != '"':
                if line[i] == "\\":
                    i += 1
                    value.append({"n": "\n", "r": "\r", "t": "\t"}.get(line[i], line[i]))
                else:
                    value.append(line[i])
                i += 1
            out[key] = "".join(value)
            i += 2
        else:
            end = line.find(" ", i)
            end = len(line) if end < 0 else end
            out[key] = line[i:end]
            i = end + 1
    return out


def test_an_event_is_one_line_of_its_fields_in_order(kv_stream: io.StringIO) -> None:
    log_event(logging.getLogger(LOGGER), logging.INFO, "object.committed", node=1, object=42, bytes=1048576)
    line = kv_stream.getvalue()
    assert line.count("\n") == 1
    assert line.split(" ", 3)[1:3] == ["level=info", f"logger={LOGGER}"]
    assert line.rstrip("\n").endswith("event=object.committed node=1 object=42 bytes=1048576")
    assert line.startswith("ts=20")
    assert line.split(" ")[0].endswith("Z")


def test_values_with_spaces_quotes_and_newlines_are_quoted_and_parse_back(kv_stream: io.StringIO) -> None:
    odd = 'a b "c" = d\\e\nnext line'
    log_event(logging.getLogger(LOGGER), logging.WARNING, "x.y", reason=odd, empty="", streams=[1, 2, 3])
    line = kv_stream.getvalue()
    assert line.count("\n") == 1
    parsed = _fields(line.rstrip("\n"))
    assert parsed["reason"] == odd
    assert parsed["empty"] == ""
    assert parsed["streams"] == "1,2,3"
    assert parsed["event"] == "x.y"


def test_format_value_of_plain_types() -> None:
    assert format_value(None) == "-"
    assert format_value(True) == "true"
    assert format_value(0.5) == "0.5"
    assert format_value("plain") == "plain"
    assert format_value("two words") == '"two words"'
    assert format_value("k=v") == '"k=v"'


def test_a_plain_record_becomes_msg_and_a_traceback_stays_on_the_line(kv_stream: io.StringIO) -> None:
    log = logging.getLogger(LOGGER)
    log.warning("upload of %d bytes failed", 10)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        log.exception("compactor stopped")
    lines = kv_stream.getvalue().splitlines()
    assert len(lines) == 2
    assert _fields(lines[0])["msg"] == "upload of 10 bytes failed"
    second = _fields(lines[1])
    assert second["exc_type"] == "RuntimeError"
    assert "Traceback" in second["exc"]
    assert "boom" in second["exc"]


def test_the_message_of_an_event_carries_its_fields_for_any_handler(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    log_event(logging.getLogger(LOGGER), logging.DEBUG, "stream.opened", stream=7, epoch=3)
    (record,) = caplog.records
    assert record.getMessage() == "stream.opened stream=7 epoch=3"
    assert getattr(record, EVENT_ATTR) == "stream.opened"
    assert getattr(record, FIELDS_ATTR) == {"stream": 7, "epoch": 3}
    assert record.funcName == "test_the_message_of_an_event_carries_its_fields_for_any_handler"


def test_a_disabled_level_builds_no_record(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)

    class Exploding:
        def __str__(self) -> str:
            raise AssertionError("formatted although the level is off")

    log_event(logging.getLogger(LOGGER), logging.DEBUG, "x", value=Exploding())
    assert caplog.records == []


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("connect postgresql://app:hunter2pw@db.example:5432/meta failed", "hunter2pw"),
        ("0@s3://b?endpoint=http://h&accessKey=AK&secretKey=s3cr3t/val+ue&pathStyle=true", "s3cr3t/val+ue"),
        ("dsn: host=db user=app password=pw-in-dsn dbname=x", "pw-in-dsn"),
        ("{'aws_secret_access_key': 'dictsecret1'}", "dictsecret1"),
        ("redis://:only-a-password@h:1/0", "only-a-password"),
    ],
)
def test_redact_removes_the_credential_in_common_shapes(text: str, secret: str) -> None:
    out = redact(text)
    assert secret not in out
    assert "***" in out


def test_redact_removes_env_and_registered_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "envsecret-123")
    register_secret("registered-secret-456")
    register_secret("abc")  # too short: never redacted
    out = redact("a envsecret-123 b registered-secret-456 c abc")
    assert out == "a *** b *** c abc"


def test_the_filter_redacts_message_args_fields_and_traceback(
    kv_stream: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KAFKA_S3_SECRET_KEY", "kafka-secret-789")
    log = logging.getLogger(LOGGER)
    log.error("connect %s", "postgresql://u:pgpass999@h/db")
    log_event(
        log, logging.INFO, "bucket.opened", uri="s3://b?secretKey=uri-secret-1", note="kafka-secret-789"
    )
    try:
        raise ValueError("secret kafka-secret-789 in an exception")
    except ValueError:
        log.debug("failed", exc_info=True)
    text = kv_stream.getvalue()
    for secret in ("pgpass999", "uri-secret-1", "kafka-secret-789"):
        assert secret not in text
    assert text.count("***") >= 4
    assert len(text.splitlines()) == 3


def test_the_cli_leaves_no_log_handler_behind_after_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--log-level", "debug", "inspect", "object", "/nonexistent/object"])
    err = capsys.readouterr().err
    assert code == 2
    assert "error:" in err
    root = logging.getLogger()
    assert not [h for h in root.handlers if isinstance(h, SetupHandler)]


def test_the_cli_refuses_an_unknown_log_format(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--log-format", "json", "streams"])
    assert "invalid choice" in capsys.readouterr().err
