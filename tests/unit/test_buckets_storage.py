"""MultiBucketStorage on in-memory buckets with injected faults: each strategy's placement, failover
within the threshold, probes bringing a bucket back, replication all-or-nothing, reads falling back,
live weights, a weight of 0 draining, and the keys that are not objects."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest

from s3stream.buckets.health import BucketHealth
from s3stream.buckets.monitor import HEALTH_KEY_PREFIX, WEIGHTS_KEY, BucketsMonitor
from s3stream.buckets.storage import MultiBucketStorage
from s3stream.buckets.strategy import make_strategy
from s3stream.errors import InvalidArgumentError, NotFoundError, UnavailableError
from s3stream.storage.memory import MemoryObjectStorage
from tests.support.buckets import FakeClock, make_rig
from tests.support.faults import Fault


async def test_round_robin_spreads_new_objects_evenly_and_records_them() -> None:
    rig = make_rig("round_robin")
    written = [await rig.write(f"o{i}".encode()) for i in range(10)]
    assert Counter(rig.holders(key)[0] for _, key in written) == {0: 5, 1: 5}
    placements = await rig.metadata.placements([object_id for object_id, _ in written])
    for object_id, key in written:
        assert placements[object_id] == tuple(rig.holders(key))
        assert await rig.storage.get(key) == f"o{written.index((object_id, key))}".encode()


async def test_failover_writes_to_the_primary_while_it_is_healthy() -> None:
    rig = make_rig("failover", (5, 2))
    written = [await rig.write() for _ in range(4)]
    assert all(rig.holders(key) == [5] for _, key in written)


async def test_failover_moves_a_failing_upload_to_the_standby_within_the_same_complete() -> None:
    rig = make_rig("failover")
    rig.fail(0, "upload.complete")
    object_id, key = await rig.write(b"moved")  # no error reaches the caller
    assert rig.holders(key) == [1]
    assert await rig.storage.get(key) == b"moved"
    assert await rig.metadata.placements([object_id]) == {object_id: (0, 1)}  # recorded before each try
    assert rig.storage.health.is_healthy(0)  # one error is below the threshold


async def test_failover_marks_the_primary_unhealthy_after_the_threshold_and_probes_bring_it_back() -> None:
    rig = make_rig("failover", errors_max=3)
    rig.fail(0)
    before = []
    for _ in range(3):
        before.append(await rig.write(b"x"))
        rig.clock.now_s += 4.5  # past the call deadline: the primary is no longer suspect, tried again
    assert not rig.storage.health.is_healthy(0)
    assert all(rig.holders(key) == [1] for _, key in before)
    calls = rig.faulty[0].calls["upload.complete"]
    _, key = await rig.write(b"y")
    assert rig.holders(key) == [1]
    assert rig.faulty[0].calls["upload.complete"] == calls  # the unhealthy primary is not tried
    rig.storage.health._probe = rig.storage._probe
    await rig.storage.health.probe_now()  # still failing: stays unhealthy
    assert not rig.storage.health.is_healthy(0)
    rig.heal(0)
    for _ in range(2):
        await rig.storage.health.probe_now()
    assert not rig.storage.health.is_healthy(0)  # 2 of 3 successful probes
    await rig.storage.health.probe_now()
    assert rig.storage.health.is_healthy(0)
    _, key = await rig.write(b"z")
    assert rig.holders(key) == [0]


async def test_after_one_failure_new_writes_skip_the_primary_for_a_call_deadline() -> None:
    rig = make_rig("failover", errors_max=3)
    rig.fail(0, "upload.complete", times=1)
    _, moved = await rig.write(b"a")
    assert rig.holders(moved) == [1]
    assert rig.storage.health.is_healthy(0)  # one error: below the threshold, but suspect
    _, direct = await rig.write(b"b")
    assert rig.holders(direct) == [1]
    assert rig.faulty[0].calls["upload.complete"] == 1  # not asked again meanwhile
    await rig.storage.put("metadata-copy/x", b"c")  # other keys too
    assert rig.holders("metadata-copy/x") == [1]
    rig.clock.now_s += 4.5  # the deadline (2 x the 2 s request timeout) passed
    _, back = await rig.write(b"d")
    assert rig.holders(back) == [0]


async def test_objects_in_a_failed_bucket_read_again_when_it_returns() -> None:
    rig = make_rig("failover")
    _, key = await rig.write(b"old")
    rig.fail(0)
    with pytest.raises(UnavailableError):
        await rig.storage.get(key)
    rig.heal(0)
    assert await rig.storage.get(key) == b"old"


async def test_replication_commits_only_when_every_bucket_holds_the_object() -> None:
    rig = make_rig("replication", (0, 1, 2))
    object_id, key = await rig.write(b"r")
    assert rig.holders(key) == [0, 1, 2]
    assert await rig.metadata.placements([object_id]) == {object_id: (0, 1, 2)}
    rig.fail(1, "upload.complete")
    _, failed_key = await rig.new_key()
    upload = rig.storage.upload(failed_key)
    await upload.write(b"partial")
    with pytest.raises(UnavailableError):
        await upload.complete()
    assert rig.holders(failed_key) == []  # the published copies were deleted again


async def test_replication_put_is_all_or_nothing() -> None:
    rig = make_rig("replication")
    rig.fail(0, "put")
    _, key = await rig.new_key()
    with pytest.raises(UnavailableError):
        await rig.storage.put(key, b"p")
    assert rig.holders(key) == []


async def test_reads_fall_back_to_another_copy_on_error_or_a_missing_key() -> None:
    rig = make_rig("replication")
    _, key = await rig.write(b"copy")
    await rig.inner[0].delete([key])  # bucket 0 emptied by hand
    assert await rig.storage.get(key) == b"copy"
    assert (await rig.storage.head(key)).size_bytes == 4
    _, other = await rig.write(b"copy2")
    rig.fail(0, "get")
    assert await rig.storage.get(other, 1, 3) == b"op"


async def test_a_read_rereads_the_placement_once_before_giving_up() -> None:
    rig = make_rig("round_robin")
    object_id, key = await rig.write(b"moved")
    holder = rig.holders(key)[0]
    other = 1 - holder
    assert await rig.storage.get(key) == b"moved"  # placement cached
    await rig.inner[other].put(key, b"moved")
    await rig.inner[holder].delete([key])
    await rig.metadata.record_placement(object_id, [other])
    assert await rig.storage.get(key) == b"moved"
    await rig.inner[other].delete([key])
    with pytest.raises(NotFoundError):
        await rig.storage.get(key)


async def test_sharding_follows_the_weights_and_a_weight_of_zero_drains() -> None:
    rig = make_rig("sharding", weights={0: 3, 1: 1})
    first = [await rig.write() for _ in range(40)]
    assert Counter(rig.holders(key)[0] for _, key in first) == {0: 30, 1: 10}
    monitor = BucketsMonitor(rig.storage, rig.metadata, node_id=7, poll_ms=10)
    await rig.metadata.kv_put(WEIGHTS_KEY, b"0:0,1:1")
    assert await monitor.poll_weights()
    drained = [await rig.write() for _ in range(10)]
    assert all(rig.holders(key) == [1] for _, key in drained)
    for _, key in first:  # bucket 0 still serves reads
        assert await rig.storage.get(key) == b"payload"
    await rig.metadata.kv_put(WEIGHTS_KEY, b"0:1,1:1")
    assert await monitor.poll_weights()
    assert not await monitor.poll_weights()  # unchanged: nothing applied
    even = [await rig.write() for _ in range(10)]
    assert Counter(rig.holders(key)[0] for _, key in even) == {0: 5, 1: 5}


async def test_bad_live_weights_are_ignored_keeping_the_weights_in_force() -> None:
    rig = make_rig("sharding", weights={0: 1, 1: 0})
    monitor = BucketsMonitor(rig.storage, rig.metadata, node_id=None, poll_ms=10)
    await rig.metadata.kv_put(WEIGHTS_KEY, b"0:1,5:1")
    assert not await monitor.poll_weights()
    assert rig.storage.strategy.weights == {0: 1, 1: 0}  # type: ignore[attr-defined]


async def test_the_monitor_publishes_health_without_credentials() -> None:
    rig = make_rig("failover", errors_max=1)
    rig.fail(0, "upload.complete")
    await rig.write()
    monitor = BucketsMonitor(rig.storage, rig.metadata, node_id=3, poll_ms=10)
    await monitor.publish()
    import json

    record = json.loads(await rig.metadata.kv_get(f"{HEALTH_KEY_PREFIX}3") or b"")
    assert record["buckets"]["0"]["healthy"] is False
    assert record["buckets"]["1"]["uploads_recent"] == 1
    assert record["buckets"]["1"]["write_share"] == 1.0
    assert "injected fault" in record["buckets"]["0"]["last_error"]


async def test_copy_is_server_side_within_a_bucket_and_read_and_write_across() -> None:
    rig = make_rig("round_robin")
    _, source = await rig.write(b"0123456789")
    source_bucket = rig.holders(source)[0]
    _, same = await rig.new_key()
    _, across = await rig.new_key()
    outputs = {}
    for key in (same, across):  # round robin: the next two uploads go to the other bucket, then back
        outputs[key] = rig.storage.upload(key)
    for key, upload in outputs.items():
        await upload.copy(source, 2, 6)
        await upload.complete()
        assert await rig.storage.get(key) == b"2345"
    server_side = {b: rig.faulty[b].calls["upload.copy"] for b in (0, 1)}
    assert server_side[source_bucket] == 1
    assert server_side[1 - source_bucket] == 0


async def test_delete_goes_to_every_bucket_and_a_down_bucket_fails_it() -> None:
    rig = make_rig("replication")
    _, key = await rig.write()
    rig.fail(1, "delete")
    with pytest.raises(UnavailableError):
        await rig.storage.delete([key])
    rig.heal(1)
    await rig.storage.delete([key, "absent/key"])
    assert rig.holders(key) == []


async def test_list_is_the_union_in_key_order_each_key_once() -> None:
    rig = make_rig("round_robin")
    keys = [(await rig.write())[1] for _ in range(6)]
    await rig.inner[0].put(keys[1], b"dup")
    await rig.inner[1].put(keys[1], b"dup")
    listed = [info.key async for info in rig.storage.list("")]
    assert listed == sorted(set(keys))


async def test_other_keys_go_to_the_first_healthy_bucket_or_every_bucket_under_replication() -> None:
    rig = make_rig("round_robin")
    await rig.storage.put("marker/a", b"1")
    assert rig.holders("marker/a") == [0]
    rig.storage.health.record_error(0, UnavailableError("down"))
    for _ in range(2):
        rig.storage.health.record_error(0, UnavailableError("down"))
    await rig.storage.put("marker/b", b"2")
    assert rig.holders("marker/b") == [1]
    assert await rig.storage.get("marker/b") == b"2"  # read in list order until found
    replicated = make_rig("replication")
    upload = replicated.storage.upload("metadata-copy/log")
    await upload.write(b"log")
    await upload.complete()
    assert replicated.holders("metadata-copy/log") == [0, 1]
    assert await replicated.metadata.placements([]) == {}


async def test_objects_need_the_metadata_store_attached() -> None:
    buckets = {0: MemoryObjectStorage("a"), 1: MemoryObjectStorage("b")}
    storage = MultiBucketStorage(
        dict(buckets), strategy=make_strategy("round_robin", (0, 1), None), health=BucketHealth((0, 1))
    )
    with pytest.raises(InvalidArgumentError, match="metadata"):
        storage.upload("00000000/ns/0")
    await storage.put("plain/key", b"ok")  # other keys need no placement
    await storage.close()


async def test_a_write_that_fails_moves_the_upload_and_replays_what_was_written() -> None:
    rig = make_rig("failover")
    _, key = await rig.new_key()
    upload = rig.storage.upload(key)
    await upload.write(b"first-")
    rig.fail(0, "upload.write")
    await upload.write(bytearray(b"second"))
    await upload.complete()
    assert rig.holders(key) == [1]
    assert await rig.storage.get(key) == b"first-second"


async def test_an_object_too_large_to_replay_is_not_moved(monkeypatch: pytest.MonkeyPatch) -> None:
    import s3stream.buckets.upload as upload_module

    monkeypatch.setattr(upload_module, "REPLAY_BYTES_MAX", 4)
    rig = make_rig("failover")
    rig.fail(0, "upload.complete")
    _, key = await rig.new_key()
    upload = rig.storage.upload(key)
    await upload.write(b"too large")
    with pytest.raises(UnavailableError):
        await upload.complete()
    assert rig.holders(key) == []


async def test_a_failed_placement_record_publishes_nothing() -> None:
    rig = make_rig("round_robin")
    _, key = await rig.new_key()
    await rig.metadata.close()
    upload = rig.storage.upload(key)
    await upload.write(b"x")
    with pytest.raises(Exception, match="closed"):
        await upload.complete()
    assert rig.holders(key) == []


async def test_a_readers_probes_write_nothing() -> None:
    rig = make_rig("failover", errors_max=1)
    rig.storage.health.record_error(0, UnavailableError("down"))
    rig.storage.start(write_probes=False)
    try:
        for _ in range(3):
            await rig.storage.health.probe_now()
    finally:
        await rig.storage.close()
    assert rig.storage.health.is_healthy(0)
    assert rig.faulty[0].calls["put"] == 0
    assert rig.faulty[0].calls["head"] == 3


async def test_under_replication_a_down_bucket_does_not_stall_other_keys() -> None:
    rig = make_rig("replication", errors_max=1)
    rig.fail(1, "put")
    await rig.storage.put("metadata-copy/log-1", b"log")  # held by bucket 0: enough for a copy key
    assert rig.holders("metadata-copy/log-1") == [0]
    assert not rig.storage.health.is_healthy(1)
    await rig.storage.put("metadata-copy/log-2", b"log2")
    assert rig.faulty[1].calls["put"] == 1  # the unhealthy bucket is not asked again
    rig.heal(1)
    assert [i.key async for i in rig.storage.list("metadata-copy/")] == [
        "metadata-copy/log-1",
        "metadata-copy/log-2",
    ]
    assert await rig.storage.get("metadata-copy/log-2") == b"log2"
    rig.fail(0, "put")
    rig.fail(1, "put")
    with pytest.raises(UnavailableError):
        await rig.storage.put("metadata-copy/log-3", b"log3")


async def test_round_robin_does_not_move_an_upload_its_retry_goes_to_the_next_bucket() -> None:
    rig = make_rig("round_robin")
    _, key = await rig.new_key()
    first = rig.storage.upload(key)
    (target,) = first.targets  # type: ignore[attr-defined]
    rig.fail(target, "upload.complete")
    await first.write(b"data")
    with pytest.raises(UnavailableError):
        await first.complete()
    retry = rig.storage.upload(key)  # the upload pipeline's retry of the same object
    await retry.write(b"data")
    await retry.complete()
    assert rig.holders(key) == [1 - target]
    assert await rig.storage.get(key) == b"data"


async def test_failover_moves_an_upload_off_a_target_that_failed_since_it_was_placed() -> None:
    rig = make_rig("failover")
    object_id, key = await rig.new_key()
    upload = rig.storage.upload(key)
    assert upload.targets == (0,)  # type: ignore[attr-defined]
    await upload.write(b"placed-")
    await upload.write(b"before")
    rig.storage.health.record_error(0, UnavailableError("another call timed out"))  # suspect now
    await upload.complete()
    assert rig.holders(key) == [1]
    assert await rig.storage.get(key) == b"placed-before"
    assert rig.faulty[0].calls["upload.complete"] == 0  # never completed on the suspect bucket
    assert await rig.metadata.placements([object_id]) == {object_id: (0, 1)}


async def test_an_upload_stays_when_no_other_bucket_is_better() -> None:
    rig = make_rig("failover")
    _, key = await rig.new_key()
    upload = rig.storage.upload(key)
    await upload.write(b"x")
    for bucket_id in (0, 1):
        rig.storage.health.record_error(bucket_id, UnavailableError("timed out"))
    await upload.complete()
    assert rig.holders(key) == [0]


async def test_a_suspect_buckets_failed_probes_count_until_it_is_unhealthy() -> None:
    rig = make_rig("failover", errors_max=3)
    health = rig.storage.health
    health._probe = rig.storage._probe
    await health.probe_now()
    assert rig.faulty[0].calls["put"] == 0  # nothing suspect, nothing probed
    rig.fail(0)
    health.record_error(0, UnavailableError("a write timed out"))  # suspect, below the threshold
    rig.clock.now_s += 3.0
    await health.probe_now()
    assert health.is_healthy(0)
    rig.clock.now_s += 3.0  # the write's error alone would no longer make it suspect; the probe's does
    assert health.is_suspect(0)
    await health.probe_now()
    assert not health.is_healthy(0)  # 3 errors: the write's and two probes'
    assert rig.faulty[0].calls["put"] == 2
    _, key = await rig.write(b"w")
    assert rig.holders(key) == [1]


async def test_a_suspect_buckets_successful_probe_adds_no_error() -> None:
    rig = make_rig("failover", errors_max=2)
    health = rig.storage.health
    health._probe = rig.storage._probe
    health.record_error(0, UnavailableError("one timeout"))
    await health.probe_now()
    await health.probe_now()
    assert health.is_healthy(0)
    assert health.stats()[0].errors_recent == 1
    rig.clock.now_s += 4.5
    _, key = await rig.write(b"back")
    assert rig.holders(key) == [0]


async def test_an_object_placed_in_a_bucket_this_node_does_not_know_is_unavailable_not_missing() -> None:
    rig = make_rig("failover")  # this node knows buckets 0 and 1; another node's list added 2
    object_id, key = await rig.new_key()
    await rig.metadata.record_placement(object_id, [2])
    with pytest.raises(UnavailableError, match=r"bucket id\(s\) \[2\].*restart the node"):
        await rig.storage.get(key)
    with pytest.raises(UnavailableError, match=r"\[2\]"):
        await rig.storage.head(key)
    with pytest.raises(UnavailableError, match=r"\[2\]"):
        await rig.storage.delete([key])
    # a copy in a known bucket still reads
    both_id, both = await rig.new_key()
    await rig.metadata.record_placement(both_id, [1, 2])
    await rig.inner[1].put(both, b"here")
    assert await rig.storage.get(both) == b"here"


async def test_a_failed_source_read_of_a_copy_is_not_charged_to_the_healthy_target() -> None:
    rig = make_rig("failover", errors_max=3)
    _, source = await rig.write(b"in the primary only")
    rig.fail(0)  # the primary goes down; new objects fail over to bucket 1
    for _ in range(3):
        _, key = await rig.write(b"x")
        assert rig.holders(key) == [1]
        rig.clock.now_s += 4.5
    assert not rig.storage.health.is_healthy(0)
    # a compaction-like copy into the healthy standby, its source only in the dead primary
    _, compacted = await rig.new_key()
    before = {op: n for op, n in rig.faulty[0].calls.items() if op.startswith("upload.")}
    upload = rig.storage.upload(compacted)
    assert upload.targets == (1,)  # type: ignore[attr-defined]
    with pytest.raises(UnavailableError):
        await upload.copy(source, 0, 5)
    stats = rig.storage.stats()
    assert stats[1].errors_recent == 0
    assert stats[1].last_error == ""
    assert rig.storage.health.is_healthy(1)
    assert not rig.storage.health.is_suspect(1)
    after = {op: n for op, n in rig.faulty[0].calls.items() if op.startswith("upload.")}
    assert after == before  # the upload did not move onto the dead primary
    assert rig.holders(compacted) == []


async def test_a_failing_upload_does_not_move_onto_a_bucket_that_is_not_preferred() -> None:
    rig = make_rig("failover", errors_max=3)
    for _ in range(3):
        rig.storage.health.record_error(0, UnavailableError("down"))
    assert not rig.storage.health.is_healthy(0)
    rig.fail(1, "upload.complete", times=1)
    _, key = await rig.new_key()
    upload = rig.storage.upload(key)
    await upload.write(b"standby")
    with pytest.raises(UnavailableError):
        await upload.complete()  # the caller retries; moving onto the unhealthy primary would not help
    assert rig.faulty[0].calls["upload.write"] == 0
    assert rig.holders(key) == []


def _raising(error: Exception) -> Callable[[str], Exception]:
    return lambda _what: error


async def test_any_error_of_one_copy_falls_back_to_another_bucket() -> None:
    from s3stream.errors import AccessDeniedError, CorruptionError

    rig = make_rig("replication")
    _, key = await rig.write(b"both")
    for error in (
        AccessDeniedError("get: AccessDenied (HTTP 403): access denied"),
        CorruptionError("bad bytes", source=key),
        InvalidArgumentError("get: 400"),
    ):
        rig.faulty[0].plan.faults = [Fault("get", make_error=_raising(error))]
        rig.faulty[0].plan.enabled = True
        rig.storage.placement._cache.clear()
        assert await rig.storage.get(key) == b"both"
    rig.fail(1, "get")  # both fail: the first error is raised
    rig.faulty[0].plan.faults = [Fault("get", make_error=lambda _what: AccessDeniedError("get: denied"))]
    with pytest.raises(AccessDeniedError):
        await rig.storage.get(key)


async def test_access_denied_on_writes_counts_against_a_bucket_so_failover_leaves_it() -> None:
    from s3stream.errors import AccessDeniedError

    rig = make_rig("failover", errors_max=3)
    plan = rig.faulty[0].plan
    plan.faults = [Fault("*", make_error=lambda what: AccessDeniedError(f"{what}: access denied"))]
    plan.enabled = True
    for _ in range(3):
        _, key = await rig.write(b"x")  # moves to the standby within the call
        assert rig.holders(key) == [1]
        rig.clock.now_s += 4.5
    assert not rig.storage.health.is_healthy(0)
    await rig.storage.put("metadata-copy/z", b"z")
    assert rig.holders("metadata-copy/z") == [1]


async def test_the_monitor_logs_an_unexpected_error_and_keeps_running(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import asyncio

    rig = make_rig("sharding", weights={0: 1, 1: 1})
    real_kv_get = rig.metadata.kv_get
    calls = 0

    async def flaky_kv_get(key: str) -> bytes | None:
        nonlocal calls
        calls += 1
        if calls == 2:  # the first poll runs in start(), the second in the task
            raise RuntimeError("a bug")
        return await real_kv_get(key)

    rig.metadata.kv_get = flaky_kv_get  # type: ignore[method-assign]
    monitor = BucketsMonitor(rig.storage, rig.metadata, node_id=None, poll_ms=10)
    await monitor.start()
    try:
        await asyncio.sleep(0.05)
        await rig.metadata.kv_put(WEIGHTS_KEY, b"0:0,1:1")
        for _ in range(100):
            if rig.storage.strategy.weights == {0: 0, 1: 1}:  # type: ignore[attr-defined]
                break
            await asyncio.sleep(0.01)
        assert rig.storage.strategy.weights == {0: 0, 1: 1}  # type: ignore[attr-defined]
        assert any(
            "buckets.monitor_failed" in r.getMessage() and "a bug" in r.getMessage() for r in caplog.records
        )
    finally:
        await monitor.close()


async def test_sharding_prefers_a_healthy_weight_zero_bucket_over_dead_weighted_ones() -> None:
    rig = make_rig("sharding", (0, 1, 2), weights={0: 2, 1: 1, 2: 0})
    for bucket_id in (0, 1):
        for _ in range(3):
            rig.storage.health.record_error(bucket_id, UnavailableError("down"))
    assert not rig.storage.health.is_healthy(0)
    assert not rig.storage.health.is_healthy(1)
    written = [await rig.write() for _ in range(4)]
    assert all(rig.holders(key) == [2] for _, key in written)
    strategy = rig.storage.strategy
    healthy = rig.storage.health.is_healthy
    assert strategy.next_after((0, 1, 2), healthy, [0]) == 2
    rig.storage.health._buckets[0].healthy = True  # back: the weighted buckets are the choice again
    assert strategy.choose((0, 1, 2), healthy) == (0,)


async def test_the_last_error_is_redacted_of_a_registered_secret_with_a_comma() -> None:
    from s3stream.logfmt import register_secret

    secret = "health,Secret-Value-7c1d"
    register_secret(secret)
    rig = make_rig("failover")
    rig.storage.health.record_error(0, UnavailableError(f"PUT secretKey={secret}: signed with {secret}"))
    rig.storage.health.record_probe(1, UnavailableError(f"probe with {secret}"))
    for stats in rig.storage.stats().values():
        assert "Secret-Value" not in stats.last_error
        assert "health," not in stats.last_error


async def test_with_a_short_request_timeout_a_suspect_bucket_waits_for_the_next_probe_round() -> None:
    clock = FakeClock()
    health = BucketHealth((0, 1), request_timeout_ms=300, probe_interval_ms=1_000, clock_s=clock)
    health.record_error(0, UnavailableError("a write timed out"))
    clock.now_s += 1.5  # past twice the request timeout, but no probe round has looked yet
    assert health.is_suspect(0)
    clock.now_s += 1.0
    assert not health.is_suspect(0)


def test_round_robin_starts_at_a_random_bucket_per_process() -> None:
    firsts = {
        make_strategy("round_robin", (0, 1, 2), None).choose((0, 1, 2), lambda _: True) for _ in range(60)
    }
    assert firsts == {(0,), (1,), (2,)}
