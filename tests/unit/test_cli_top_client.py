"""``s3stream top --once`` against a real client with metrics on, while the test appends to it.

The client (local storage, real exporter socket) takes appends on the event loop while ``top`` runs
in a thread; the frame names the node, shows it up, and shows the appends and the WAL it filled.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import re
from pathlib import Path

from s3stream import RecordBatch
from s3stream.assembly import open_client
from s3stream.cli import main
from tests.support.configs import small_config

RECORD_BYTES = 4096


def _figure(out: str, name: str) -> str:
    for line in out.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if cells[0] == name:
            return cells[1]
    raise AssertionError(f"no {name!r} row in:\n{out}")


async def test_top_shows_a_live_client_appending(tmp_path: Path) -> None:
    config = small_config(node_id=5, metrics_exporter_uri="prometheus://?host=127.0.0.1&port=0")
    client = await open_client(tmp_path, config=config)
    try:
        endpoint = client.metrics_endpoint
        assert endpoint is not None
        stream = await client.streams.create_and_open_stream()
        stdout = io.StringIO()

        def run_top() -> int:
            with contextlib.redirect_stdout(stdout):
                return main(["top", "--once", "--interval", "1", endpoint])

        top = asyncio.create_task(asyncio.to_thread(run_top))
        appended = 0
        while not top.done():
            await stream.append(RecordBatch(b"r" * RECORD_BYTES))
            appended += 1
            await asyncio.sleep(0.002)
        assert await top == 0
        await stream.close()
    finally:
        await client.close()
    out = stdout.getvalue()
    assert appended > 10
    assert "node 5" in out
    assert _figure(out, "state") == "up"
    assert float(_figure(out, "appends/s").replace(",", "")) > 0
    assert float(_figure(out, "append MiB/s")) > 0
    assert _figure(out, "append p50") != "-"
    assert _figure(out, "WAL fill").endswith("%")
    assert _figure(out, "epoch") != "-"
