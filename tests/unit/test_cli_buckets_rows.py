"""``s3stream buckets``' rows from the recorded list, the usage and the nodes' reports (pure)."""

from __future__ import annotations

import json

import pytest

from s3stream.binding import RecordedStorage
from s3stream.cli.buckets import LOCAL_URI, REPORT_STALE_MS, NodeReport, bucket_rows, recorded_buckets
from s3stream.errors import CorruptionError

LIST = "0@s3://a?endpoint=http%3A%2F%2Fh%3A1&accessKey=AK&secretKey=SK,1@s3://b?endpoint=http%3A%2F%2Fh%3A1"


def report(node_id: int, at_ms: int, **buckets: dict[str, object]) -> NodeReport:
    value = json.dumps({"at_ms": at_ms, "buckets": {k.lstrip("b"): v for k, v in buckets.items()}})
    return NodeReport.decode(node_id, value.encode())


def test_the_recorded_list_gives_ids_and_uris_without_credentials() -> None:
    rows = recorded_buckets(RecordedStorage(LIST, "ns"), None)
    assert [bucket_id for bucket_id, _ in rows] == [0, 1]
    assert all("SK" not in uri and "AK" not in uri and "@" not in uri for _, uri in rows)
    assert rows[1][1].startswith("s3://b?")
    assert recorded_buckets(None, LIST) == rows  # nothing recorded: the list given
    assert recorded_buckets(RecordedStorage(None, "ns"), LIST) == [(0, LOCAL_URI)]
    assert recorded_buckets(None, None) == [(0, LOCAL_URI)]


def test_health_is_summed_over_nodes_and_the_share_is_of_all_uploads() -> None:
    reports = [
        report(
            1, 9_000, b0={"healthy": True, "uploads_recent": 3}, b1={"healthy": True, "uploads_recent": 1}
        ),
        report(
            2,
            9_500,
            b0={
                "healthy": False,
                "errors_recent": 4,
                "last_error": "PUT failed secretKey=SK",
                "uploads_recent": 0,
            },
            b1={"healthy": True, "uploads_recent": 4},
        ),
    ]
    rows = bucket_rows(
        [(0, "s3://a"), (1, "s3://b"), (2, "s3://c")], {0: (5, 500), 2: (1, 7)}, reports, now_ms=10_000
    )
    assert [r["health"] for r in rows] == ["unhealthy", "healthy", None]
    assert [r["errors_recent"] for r in rows] == [4, 0, None]
    assert [r["uploads_recent"] for r in rows] == [3, 5, None]
    assert [r["write_share"] for r in rows] == [0.375, 0.625, None]
    assert [(r["objects"], r["bytes"]) for r in rows] == [(5, 500), (0, 0), (1, 7)]
    assert [r["report_age_ms"] for r in rows] == [500, 500, None]
    assert rows[0]["last_error"] == "PUT failed secretKey=***"


def test_no_uploads_means_no_share() -> None:
    rows = bucket_rows([(0, "x")], {}, [report(0, 1, b0={"healthy": True, "uploads_recent": 0})], now_ms=1)
    assert rows[0]["write_share"] is None
    assert rows[0]["health"] == "healthy"


@pytest.mark.parametrize("value", [b"not json", b'{"at_ms": 1}', b'{"at_ms": 1, "buckets": {"0": 3}}'])
def test_an_unreadable_report_is_a_corruption_error(value: bytes) -> None:
    with pytest.raises(CorruptionError, match="node 3"):
        NodeReport.decode(3, value)


def test_a_reported_last_error_is_redacted_of_a_registered_secret_with_a_comma() -> None:
    from s3stream.logfmt import register_secret

    secret = "cli,Rows-Secret-9f2b"
    register_secret(secret)
    text = f"UnavailableError: PUT failed for secretKey={secret} (key {secret})"
    rows = bucket_rows([(0, "x")], {}, [report(0, 1, b0={"healthy": False, "last_error": text})], now_ms=1)
    shown = rows[0]["last_error"]
    assert "Rows-Secret" not in shown
    assert "cli," not in shown


def test_a_stale_report_of_a_stopped_node_counts_for_nothing_but_its_age() -> None:
    reports = [
        report(1, 0, b0={"healthy": False, "errors_recent": 9, "uploads_recent": 2, "last_error": "old"}),
        report(2, 50_000, b0={"healthy": True, "uploads_recent": 1}),
    ]
    rows = bucket_rows([(0, "x")], {}, reports, now_ms=REPORT_STALE_MS + 1_000)
    assert (rows[0]["health"], rows[0]["errors_recent"], rows[0]["uploads_recent"]) == ("healthy", 0, 1)
    assert rows[0]["last_error"] is None
    only_stale = bucket_rows([(0, "x")], {}, reports[:1], now_ms=REPORT_STALE_MS + 1_000)
    assert only_stale[0]["health"] is None
    assert only_stale[0]["report_age_ms"] == REPORT_STALE_MS + 1_000
