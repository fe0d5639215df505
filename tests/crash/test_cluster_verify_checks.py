"""The soak's record checks find each violation they exist for (a checker that cannot fail proves nothing)."""

from __future__ import annotations

from pathlib import Path

from s3stream.metadata.base import StreamState
from tests.crash.cluster_verify import StreamRead, check_records, read_logs

LOG = """\
T 7 1.1.1
A 7 0 1.1.1 1 1
T 7 1.1.2
A 7 1 1.1.2 1 1
T 7 1.1.3
U 7 1.1.3 MovedError
T 7 2.1.1
A 7 2 2.1.1 2 1
T 7 2.1.2
"""


def _logs(tmp_path: Path, text: str = LOG) -> Path:
    path = tmp_path / "node.log"
    path.write_text(text)
    return path


def _read(*records: tuple[int, str], end: int | None = None) -> list[StreamRead]:
    rows = [(offset, 1, record_id) for offset, record_id in records]
    end_offset = rows[-1][0] + 1 if end is None else end
    return [StreamRead(7, StreamState.CLOSED, 0, end_offset, rows)]


def test_a_consistent_run_has_no_violations(tmp_path: Path) -> None:
    logs = read_logs([_logs(tmp_path)])
    assert logs.unknown == {"1.1.3", "2.1.2"}
    assert check_records(logs, _read((0, "1.1.1"), (1, "1.1.2"), (2, "2.1.1"), (3, "2.1.2"))) == []


def test_a_lost_ack_a_duplicate_a_gap_and_a_stranger_are_each_reported(tmp_path: Path) -> None:
    logs = read_logs([_logs(tmp_path)])
    lost = check_records(logs, _read((0, "1.1.1"), (1, "1.1.2")))
    assert any("nothing there" in v for v in lost)
    twice = check_records(logs, _read((0, "1.1.1"), (1, "1.1.2"), (2, "2.1.1"), (3, "1.1.1")))
    assert any("read twice" in v for v in twice)
    gap = check_records(logs, _read((0, "1.1.1"), (1, "1.1.2"), (3, "2.1.1")))
    assert any("gap or overlap" in v for v in gap)
    stranger = check_records(logs, _read((0, "1.1.1"), (1, "1.1.2"), (2, "2.1.1"), (3, "9.9.9")))
    assert any("never appended" in v for v in stranger)


def test_an_ack_whose_offset_holds_another_record_is_reported_as_a_fenced_ack(tmp_path: Path) -> None:
    logs = read_logs([_logs(tmp_path)])
    violations = check_records(logs, _read((0, "1.1.1"), (1, "1.1.2"), (2, "1.1.3"), (3, "2.1.1")))
    assert any("holds 1.1.3" in v and "fenced" in v for v in violations)


def test_a_torn_last_line_is_ignored_and_a_stream_left_open_is_reported(tmp_path: Path) -> None:
    logs = read_logs([_logs(tmp_path, LOG + "A 7 3 2.1")])
    assert logs.problems == []
    reads = _read((0, "1.1.1"), (1, "1.1.2"), (2, "2.1.1"))
    reads[0].state = StreamState.OPENED
    assert any("still OPENED" in v for v in check_records(logs, reads))


def test_a_record_whose_append_was_refused_as_moved_is_reported_when_read(tmp_path: Path) -> None:
    logs = read_logs([_logs(tmp_path)])
    assert logs.refused == {"1.1.3"}
    violations = check_records(logs, _read((0, "1.1.1"), (1, "1.1.2"), (2, "2.1.1"), (3, "1.1.3")))
    assert any("refused, yet it is there" in v for v in violations)
