"""What a restore must equal: a restored metadata database plus the killed database's groups it lacks.

A process killed after a log object's PUT and before it deleted that log's ``pending_copy`` rows
leaves groups that are both in the bucket (so restore applies them) and still pending locally. The
restored database therefore ends at the report's ``last_seq``, which may be past the killed
database's first pending group; only the pending groups after ``last_seq`` were never copied.
"""

from __future__ import annotations

import itertools
import shutil
import sqlite3
from pathlib import Path

from s3stream.metadata import sql_apply
from s3stream.metadata.changelog import decode_group


def replay_uncopied(killed: Path, restored: Path, out: Path, *, restored_last_seq: int) -> list[int]:
    """Write to ``out`` the ``restored`` database with the ``killed`` database's pending groups after
    ``restored_last_seq`` applied, in order; returns their sequence numbers.

    Asserts that the restore holds every group the killed database had deleted from ``pending_copy``
    (each was in the bucket) and no group the killed database never committed.
    """
    conn = sqlite3.connect(killed)
    try:
        (next_seq,) = conn.execute("SELECT next_seq FROM copy_state").fetchone()
        pending: list[tuple[int, bytes]] = conn.execute(
            "SELECT seq, payload FROM pending_copy ORDER BY seq"
        ).fetchall()
    finally:
        conn.close()
    seqs = [seq for seq, _ in pending]
    assert all(b == a + 1 for a, b in itertools.pairwise(seqs)), seqs
    assert not seqs or seqs[-1] == next_seq - 1, (seqs, next_seq)
    first_pending = seqs[0] if seqs else next_seq
    assert first_pending - 1 <= restored_last_seq <= next_seq - 1, (restored_last_seq, seqs, next_seq)
    shutil.copy(restored, out)
    replay = sqlite3.connect(out, isolation_level=None)
    try:
        replay.execute("PRAGMA foreign_keys = ON")
        replay.execute("BEGIN IMMEDIATE")
        applied = []
        for seq, payload in pending:
            if seq > restored_last_seq:
                sql_apply.apply(replay, decode_group(payload, source=f"pending group {seq}").changes)
                applied.append(seq)
        replay.execute("COMMIT")
    finally:
        replay.close()
    return applied
