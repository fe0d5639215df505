"""``s3stream produce`` makes its payloads as the appends go, never all up front on the event loop.

The node's lease is renewed by a task on the same loop: building every payload before the first
append (200,000 of them on a loaded machine) stalls the loop past the lease and the node is fenced.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from s3stream.cli import main, produce
from tests.support.configs import cli_data_dir_args

STREAMS = 2
COUNT = 3_000


def test_payloads_are_made_chunk_by_chunk_as_appends_are_acknowledged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    made = 0
    made_at_ack: list[int] = []
    real_payload = produce.generated_payload
    real_ack = produce.AckPrinter.ack

    def counting_payload(stream_id: int, index: int, size_bytes: int) -> bytes:
        nonlocal made
        made += 1
        return real_payload(stream_id, index, size_bytes)

    def noting_ack(self: produce.AckPrinter, stream_id: int, offset: int, size_bytes: int) -> None:
        made_at_ack.append(made)
        real_ack(self, stream_id, offset, size_bytes)

    monkeypatch.setattr(produce, "generated_payload", counting_payload)
    monkeypatch.setattr(produce.AckPrinter, "ack", noting_ack)
    argv = ["produce", *cli_data_dir_args(tmp_path), "--streams", str(STREAMS), "--count", str(COUNT)]
    assert main([*argv, "--size", "40", "--json"]) == 0

    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    acks = [line for line in lines if "offset" in line]
    assert len(acks) == len(made_at_ack) == made == STREAMS * COUNT
    # The i-th acknowledgement comes before the chunk after its own is made.
    for i, made_then in enumerate(made_at_ack):
        assert made_then <= (i // produce.INFLIGHT_MAX + 1) * produce.INFLIGHT_MAX
    # Every record went in.
    assert lines[-1]["summary"]["next_offsets"] == {"0": COUNT, "1": COUNT}


def test_generated_plan_names_the_offsets_from_the_ends_at_the_call() -> None:
    class FakeStream:
        def __init__(self, stream_id: int, next_offset: int) -> None:
            self.stream_id = stream_id
            self.next_offset = next_offset

    streams = [FakeStream(4, 10), FakeStream(5, 0)]
    plan = produce.generated_plan(streams, 2, 12)  # type: ignore[arg-type]
    first = next(plan)
    streams[0].next_offset = 11  # an append acknowledged meanwhile does not move the plan
    assert [payload for _, payload in [first, *plan]] == [
        b"s4-r10:klmno",
        b"s5-r0:abcdef",
        b"s4-r11:lmnop",
        b"s5-r1:bcdefg",
    ]
