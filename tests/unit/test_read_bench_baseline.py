"""The read workload's raw-GET baseline is the best of two concurrencies (and, on S3, two body readers),
each measured every round."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from benchmarks.core import Context
from benchmarks.workloads import read
from tests.support.s3 import S3TestServer


async def test_the_baseline_is_the_best_of_4_and_16_gets_in_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inflights: Counter[int] = Counter()
    baseline_round = read._baseline_round

    async def watched(ctx: Context, storage: Any, spans: Any, inflight: int, **kw: Any) -> float:
        inflights[inflight] += 1
        assert not kw.get("chunked"), "the local store has no S3 body to read in chunks"
        return await baseline_round(ctx, storage, spans, inflight, **kw)

    monkeypatch.setattr(read, "_baseline_round", watched)
    ctx = Context(quick=True, work_dir=tmp_path, s3=None, params={"total_mib": "1", "object_mib": "1"})
    results = await read.run(ctx)
    # per record size: the warm-up pass (4), then 2 rounds of 4 and 16, and the sequential pass (1)
    assert inflights == {4: 2 * 3, 16: 2 * 2, 1: 2 * 2}
    for result in results:
        by_inflight = result.extra["baseline_mb_s_by_inflight"]
        assert set(by_inflight) == {4, 16}
        assert result.baseline_value == pytest.approx(max(by_inflight.values()))
        assert result.baseline == "raw ranged GETs of the same bytes, 4 MiB each, best of 4 / 16 in flight"


@pytest.mark.integration
async def test_on_s3_the_baseline_also_reads_bodies_in_chunks_and_takes_the_best(
    s3_server: S3TestServer, tmp_path: Path
) -> None:
    ctx = Context(
        quick=True,
        work_dir=tmp_path,
        s3=s3_server.bench_target(),
        params={"total_mib": "2", "object_mib": "1", "rounds": "1"},
    )
    for result in await read.run(ctx):
        plain = result.extra["baseline_mb_s_by_inflight"]
        chunked = result.extra["baseline_chunked_mb_s_by_inflight"]
        assert set(plain) == set(chunked) == {4, 16}
        assert result.baseline_value == pytest.approx(max(*plain.values(), *chunked.values()))
        assert result.baseline.endswith("best of 4 / 16 in flight, body read() or read in chunks")
