"""Structured log lines: ``log_event`` for library code, the ``key=value`` formatter, the redaction filter.

Library code reports an event with :func:`log_event`: a short dotted event name
(``object.committed``) and typed fields (``node=1 object=42 bytes=1048576``). The fields travel on
the record (``record.s3stream_event`` / ``record.s3stream_fields``), and the record's message is the
same text (``object.committed node=1 object=42 bytes=1048576``) so a plain handler, pytest's
``caplog`` or the standard library's last-resort handler print them too.

:class:`KeyValueFormatter` prints every record as one line of ``key=value`` pairs::

    ts=2026-11-27T06:50:01.123Z level=info logger=s3stream.engine.pipeline event=object.committed node=1 object=42

A record not made by ``log_event`` carries its text as ``msg="..."``. A value is quoted when it is
empty or holds a space, ``"``, ``=`` or a control character; inside quotes ``\\``, ``"`` and line
breaks are escaped, so a line never spans two lines (a traceback becomes ``exc="..."``).

:class:`RedactionFilter` is the last defence against a credential reaching a log line. It rewrites
every record that passes the handler it is attached to: the password of any ``scheme://user:pw@``
URL, the value of ``secretKey=``/``password=``-like parameters, and every known secret value (the
environment's AWS, Kafka-S3 and PostgreSQL secrets, and each one given to :func:`register_secret`)
become ``***`` in the message, the fields and the formatted traceback. The code that builds errors
already leaves secrets out; the filter catches what slips through (a library's own message).

:func:`setup_logging` is what the command line uses: one stderr handler, the chosen format
(``kv`` or ``plain``) and level, the redaction filter on the handler.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Mapping
from typing import IO, Final, Literal

EVENT_ATTR: Final = "s3stream_event"
"""Record attribute holding the event name of a record made by :func:`log_event`."""
FIELDS_ATTR: Final = "s3stream_fields"
"""Record attribute holding the fields (a dict) of a record made by :func:`log_event`."""
REDACTED: Final = "***"
"""What a secret is replaced with."""

SECRET_ENV_VARS: Final = (
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "KAFKA_S3_SECRET_KEY",
    "PGPASSWORD",
)
"""Environment variables whose values are secrets wherever they appear."""
REGISTERED_SECRETS_MAX: Final = 1024
"""Secrets :func:`register_secret` keeps (a process opens a few clients; a test run many)."""
SECRET_VALUE_LEN_MIN: Final = 4
"""Registered secrets shorter than this are ignored (redacting every "a" would ruin every line)."""

LogFormat = Literal["kv", "plain"]
LOG_FORMATS: Final[tuple[LogFormat, ...]] = ("kv", "plain")

_NEEDS_QUOTES = re.compile(r'[\s"=\\]|[\x00-\x1f\x7f]')
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@]*:)(?P<pw>[^\s@/]+)(?=@)")
_SECRET_PARAM = re.compile(
    r"(?P<head>\b(?:secretKey|secret_key|secret_access_key|aws_secret_access_key|sessionToken|"
    r"session_token|password|passwd|pwd)['\"]?\s*[=:]\s*['\"]?)(?P<value>[^\s&'\",;)}\]]+)",
    re.IGNORECASE,
)

_registered: set[str] = set()
_registered_lock = threading.Lock()


def register_secret(value: str | None) -> None:
    """Redact ``value`` from every log line from now on (a credential taken from a config or a URI).
    None, empty and values shorter than :data:`SECRET_VALUE_LEN_MIN` are ignored, and so is any past
    the first :data:`REGISTERED_SECRETS_MAX` (the patterns still catch those in URLs and URIs)."""
    if value and len(value) >= SECRET_VALUE_LEN_MIN:
        with _registered_lock:
            if len(_registered) < REGISTERED_SECRETS_MAX:
                _registered.add(value)


def _known_secrets() -> list[str]:
    with _registered_lock:
        values = set(_registered)
    for name in SECRET_ENV_VARS:
        value = os.environ.get(name)
        if value and len(value) >= SECRET_VALUE_LEN_MIN:
            values.add(value)
    return sorted(values, key=len, reverse=True)  # a secret holding another is replaced whole


def redact(text: str) -> str:
    """``text`` with every credential it shows replaced by ``***`` (see the module docstring)."""
    for secret in _known_secrets():
        if secret in text:
            text = text.replace(secret, REDACTED)
    text = _URL_PASSWORD.sub(lambda m: m.group("head") + REDACTED, text)
    return _SECRET_PARAM.sub(lambda m: m.group("head") + REDACTED, text)


def format_value(value: object) -> str:
    """One field value as logfmt: bare when it is safe, else double-quoted with escapes."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        text = f"{value:.6g}"
    elif isinstance(value, (list, tuple, set, frozenset)):
        text = ",".join(str(v) for v in value)
    else:
        text = str(value)
    if text and not _NEEDS_QUOTES.search(text):
        return text
    escaped = (
        text.replace("\\", "\\\\")
        .replace('"', '\\"')
        .replace("\n", "\\n")
        .replace("\r", "\\r")
        .replace("\t", "\\t")
    )
    return f'"{escaped}"'


def format_fields(fields: Mapping[str, object]) -> str:
    """``key=value`` pairs separated by one space, in the mapping's order."""
    return " ".join(f"{key}={format_value(value)}" for key, value in fields.items())


def log_event(logger: logging.Logger, level: int, event: str, /, **fields: object) -> None:
    """Log the event ``event`` (a short dotted name, e.g. ``object.committed``) with ``fields``.

    Costs one level check when ``level`` is disabled. The record's message is
    ``event key=value ...``; the event and fields ride on it as :data:`EVENT_ATTR` /
    :data:`FIELDS_ATTR` for :class:`KeyValueFormatter`.
    """
    if not logger.isEnabledFor(level):
        return
    text = f"{event} {format_fields(fields)}" if fields else event
    logger.log(level, "%s", text, extra={EVENT_ATTR: event, FIELDS_ATTR: dict(fields)}, stacklevel=2)


class KeyValueFormatter(logging.Formatter):
    """Every record as one line: ``ts= level= logger=`` then ``event=`` and its fields, or ``msg=``;
    an exception as ``exc_type=`` and ``exc=`` (the whole traceback, escaped onto the line)."""

    def format(self, record: logging.LogRecord) -> str:
        head: dict[str, object] = {
            "ts": _utc_iso(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        event = getattr(record, EVENT_ATTR, None)
        fields = getattr(record, FIELDS_ATTR, None)
        if isinstance(event, str) and isinstance(fields, dict):
            head["event"] = event
            head.update(fields)
        else:
            head["msg"] = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            head["exc_type"] = type(record.exc_info[1]).__name__
            if not record.exc_text:
                record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            head["exc"] = record.exc_text
        if record.stack_info:
            head["stack"] = record.stack_info
        return format_fields(head)


def _utc_iso(created: float) -> str:
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created))
    return f"{seconds}.{int(created * 1000) % 1000:03d}Z"


class RedactionFilter(logging.Filter):
    """Rewrites each record so that no credential is left in its message, fields or traceback.

    Attach it to a handler (a handler's filters see the records of every logger below the one it is
    on). It never drops a record. After it ran: ``record.msg`` is the redacted message with no
    ``args``, every string field is redacted, and ``record.exc_text`` holds the redacted traceback.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except (TypeError, ValueError):  # a bad format string: keep what can be shown
            message = f"{record.msg!s} {record.args!r}"
        record.msg = redact(message)
        record.args = None
        fields = getattr(record, FIELDS_ATTR, None)
        if isinstance(fields, dict):
            setattr(record, FIELDS_ATTR, {k: _redact_value(v) for k, v in fields.items()})
        if record.exc_info and record.exc_info[1] is not None and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


def _redact_value(value: object) -> object:
    if isinstance(value, (int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_redact_value(v) for v in value]
    return redact(str(value))


def make_formatter(log_format: LogFormat) -> logging.Formatter:
    """The formatter of ``log_format``: ``kv`` (:class:`KeyValueFormatter`) or ``plain``
    (``time level logger: message``, where an event's message is ``event key=value ...``)."""
    if log_format == "kv":
        return KeyValueFormatter()
    if log_format == "plain":
        return logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    raise ValueError(f"log format must be one of {LOG_FORMATS}, got {log_format!r}")


class SetupHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler :func:`setup_logging` installs (its own class, so a second call finds the first)."""


def setup_logging(
    log_format: LogFormat = "kv", level: int | str = logging.WARNING, stream: IO[str] | None = None
) -> logging.Handler:
    """Route every log record to one handler on ``stream`` (stderr by default) with ``log_format`` and
    the :class:`RedactionFilter`; the root logger gets ``level``. Replaces the handlers an earlier
    call installed (calling it twice leaves one handler). Returns the handler."""
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, SetupHandler)]:
        root.removeHandler(old)
    handler = SetupHandler(stream)
    handler.setFormatter(make_formatter(log_format))
    handler.addFilter(RedactionFilter())
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
    return handler
