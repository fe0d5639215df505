"""The engine reports its events as structured records: an event name and the fields that identify it.

A real client (local storage) appends, uploads, compacts, closes and opens again; the
records are read back as ``log_event`` made them and as the CLI's kv lines.
"""

from __future__ import annotations

import io
import logging
from pathlib import Path

import pytest

from compaction.compactor import Compactor
from s3stream import RecordBatch
from s3stream.assembly import open_client
from s3stream.logfmt import EVENT_ATTR, FIELDS_ATTR, setup_logging
from tests.support.configs import small_config

CONFIG = small_config(node_id=3)


def _events(caplog: pytest.LogCaptureFixture, name: str) -> list[dict[str, object]]:
    return [getattr(r, FIELDS_ATTR) for r in caplog.records if getattr(r, EVENT_ATTR, None) == name]


async def test_uploads_recovery_and_compaction_are_events_with_their_fields(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    root = logging.getLogger()
    level = root.level
    lines = io.StringIO()
    handler = setup_logging("kv", logging.DEBUG, lines)
    try:
        client = await open_client(tmp_path, config=CONFIG)
        stream = await client.streams.create_and_open_stream()
        for _ in range(8):
            await stream.append(RecordBatch(b"x" * 200_000))
        await stream.close()
        compactor = client.components["compactor"]
        assert isinstance(compactor, Compactor)
        await compactor.run_once(stream_objects=True)
        await client.close()
        client = await open_client(tmp_path, config=CONFIG)
        await client.close()
    finally:
        root.removeHandler(handler)
        root.setLevel(level)

    committed = _events(caplog, "object.committed")
    assert committed, "no object.committed event"
    assert all(e["node"] == 3 for e in committed)
    assert sum(int(str(e["bytes"])) for e in committed) >= 8 * 200_000
    assert all({"object", "epoch", "order", "streams", "stream_objects"} <= e.keys() for e in committed)
    opened = _events(caplog, "stream.opened")
    assert opened
    assert opened[0]["node"] == 3
    assert _events(caplog, "stream.closed")
    assert _events(caplog, "node.lease_started")[0]["node"] == 3
    runs = _events(caplog, "compaction.run")
    assert runs, "no compaction.run event"
    run = runs[-1]
    assert run["node"] == 3
    assert {"bytes_read", "bytes_written", "gc_deleted", "duration_ms"} <= run.keys()
    text = lines.getvalue()
    assert "event=object.committed node=3 " in text
    assert all(line.startswith("ts=") for line in text.splitlines())
