"""The ingest latency run's young-collection extra counts generation 0 and 1 collections, not full ones."""

from __future__ import annotations

import gc

from benchmarks.workloads.ingest import YoungCollections


def test_young_collections_count_generations_0_and_1_with_their_cpu_time() -> None:
    garbage = [[i] for i in range(50_000)]
    with YoungCollections() as young:
        gc.collect(0)
        gc.collect(1)
        gc.collect(1)
        gc.collect()  # a full collection is not counted
    del garbage
    summary = young.summary_ms()
    assert summary["gen0"]["count"] >= 1
    assert summary["gen1"]["count"] >= 2
    for generation in ("gen0", "gen1"):
        assert 0 <= summary[generation]["cpu_max"] <= summary[generation]["cpu_total"]
    assert gc.callbacks.count(young._callback) == 0
