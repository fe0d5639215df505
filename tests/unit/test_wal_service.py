"""The WAL service on in-memory devices: append, order, trim, wrap-around, full, failures, recovery."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import mmap
import os
import random
import threading
from pathlib import Path
from typing import Literal

import pytest

from tests.support.wal_faults import FaultyDevice
from wal import (
    BlockWAL,
    InvalidWalConfig,
    MemoryDevice,
    SyncBlockWAL,
    WalArgumentError,
    WalCapacityError,
    WalClosedError,
    WalConfig,
    WalCorruptionError,
    WalFencedError,
    WalIOError,
    WalLockedError,
    WalStateError,
)
from wal.format import RECORD_HEADER_SIZE, decode_wal_header

CONFIG = WalConfig(
    capacity_bytes=256 << 10,
    record_max_bytes=8 << 10,
    batch_max_bytes=16 << 10,
    inflight_max_bytes=64 << 10,
    direct_io="off",
)
AREA = CONFIG.record_area_bytes


def body(i: int, size: int = 100) -> bytes:
    return i.to_bytes(4, "big") * (size // 4) + bytes(size % 4)


async def reopen(dev: MemoryDevice, config: WalConfig = CONFIG) -> tuple[BlockWAL, list[tuple[int, bytes]]]:
    wal = await BlockWAL.open(MemoryDevice(dev.size_bytes, dev.data), config)
    return wal, [(r.offset, r.data) async for r in wal.recover()]


async def test_append_returns_increasing_offsets_and_recover_returns_them() -> None:
    dev = MemoryDevice(CONFIG.device_bytes)
    wal = await BlockWAL.open(dev, CONFIG)
    assert wal.mode == "memory"
    offsets = [await wal.append(body(i)) for i in range(20)]
    assert offsets == sorted(offsets)
    assert offsets[1] - offsets[0] >= 100 + RECORD_HEADER_SIZE
    await wal.close()
    wal, recs = await reopen(dev)
    assert recs == [(o, body(i)) for i, o in enumerate(offsets)]
    await wal.close()


async def test_concurrent_appends_complete_in_offset_order_in_few_groups() -> None:
    dev = MemoryDevice(CONFIG.device_bytes)
    wal = await BlockWAL.open(dev, CONFIG)
    done: list[int] = []

    async def one(i: int) -> None:
        done.append(await wal.append(body(i, 50)))

    await asyncio.gather(*(one(i) for i in range(200)))
    assert done == sorted(done)
    assert wal.stats["groups"] < 20
    await wal.close()


async def test_a_large_queue_with_nothing_in_flight_is_written_as_two_groups_at_once() -> None:
    config = WalConfig(
        **{
            **CONFIG.__dict__,
            "capacity_bytes": 8 << 20,
            "batch_max_bytes": 1 << 20,
            "inflight_max_bytes": 1 << 20,
        }
    )
    dev = MemoryDevice(config.device_bytes)
    wal = await BlockWAL.open(dev, config)
    offsets = await asyncio.gather(*(wal.append(body(i, 1000)) for i in range(300)))  # ~300 KiB queued
    assert offsets == sorted(offsets)
    assert wal.stats["groups"] == 2  # halves, both in flight at once (K = 2)
    # ~200 KiB (a burst of 1 KiB appends at half load): below the split size, one write
    small = await asyncio.gather(*(wal.append(body(i, 1000)) for i in range(200)))
    assert small[0] > offsets[-1]
    assert wal.stats["groups"] == 3
    await wal.close()
    single = WalConfig(**{**config.__dict__, "io_threads": 1})
    wal = await BlockWAL.open(MemoryDevice(single.device_bytes), single)
    await asyncio.gather(*(wal.append(body(i, 1000)) for i in range(300)))
    assert wal.stats["groups"] == 1  # K = 1: nothing to split into
    await wal.close()
    wal, recs = await reopen(dev, config)
    assert [o for o, _ in recs] == offsets + small
    await wal.close()


async def test_append_many_returns_offsets_in_order() -> None:
    dev = MemoryDevice(CONFIG.device_bytes)
    wal = await BlockWAL.open(dev, CONFIG)
    data = [body(i, 30 + i % 50) for i in range(1000)]
    offsets = await wal.append_many(data)
    assert offsets == sorted(offsets)
    assert await wal.append_many([]) == []
    await wal.close()
    wal, recs = await reopen(dev)
    assert recs == list(zip(offsets, data, strict=True))
    await wal.close()


async def test_trim_drops_records_strictly_below_the_offset() -> None:
    dev = MemoryDevice(CONFIG.device_bytes)
    wal = await BlockWAL.open(dev, CONFIG)
    offsets = [await wal.append(body(i)) for i in range(10)]
    await wal.trim(offsets[4])
    assert wal.trim_offset == offsets[4]
    await wal.close()
    wal, recs = await reopen(dev)
    assert [o for o, _ in recs] == offsets[4:]
    await wal.trim(wal.next_offset)
    await wal.close()
    wal, recs = await reopen(dev)
    assert recs == []
    await wal.close()


async def test_trim_beyond_the_end_is_an_argument_error() -> None:
    wal = await BlockWAL.open(MemoryDevice(CONFIG.device_bytes), CONFIG)
    await wal.append(b"x")
    with pytest.raises(WalArgumentError):
        await wal.trim(wal.next_offset + 1)
    await wal.close()


async def test_record_above_max_is_an_argument_error() -> None:
    wal = await BlockWAL.open(MemoryDevice(CONFIG.device_bytes), CONFIG)
    with pytest.raises(WalArgumentError):
        await wal.append(bytes(CONFIG.record_max_bytes + 1))
    assert await wal.append(bytes(CONFIG.record_max_bytes)) == 0
    await wal.close()


async def test_wrap_around_over_many_cycles_keeps_untrimmed_records() -> None:
    rng = random.Random(7)
    dev = MemoryDevice(CONFIG.device_bytes)
    wal = await BlockWAL.open(dev, CONFIG)
    live: dict[int, bytes] = {}
    i = 0
    while wal.next_offset < 12 * AREA:
        batch = [body(i + k, rng.randrange(1, 6000)) for k in range(rng.randrange(1, 8))]
        i += len(batch)
        for o, d in zip(await wal.append_many(batch), batch, strict=True):
            live[o] = d
        if wal.used_bytes > AREA // 2:
            cut = sorted(live)[len(live) // 2]
            await wal.trim(cut)
            live = {o: d for o, d in live.items() if o >= cut}
    await wal.close()
    wal, recs = await reopen(dev)
    assert dict(recs) == live
    assert [o for o, _ in recs] == sorted(live)
    await wal.close()


async def test_full_device_raises_capacity_error_and_never_overwrites() -> None:
    dev = MemoryDevice(CONFIG.device_bytes)
    wal = await BlockWAL.open(dev, CONFIG)
    written: list[int] = []

    async def fill() -> None:
        for i in range(10_000):
            written.append(await wal.append(body(i, 4000)))

    with pytest.raises(WalCapacityError):
        await fill()
    assert len(written) > 40
    await wal.trim(written[10])
    written.append(await wal.append(body(99, 4000)))  # room again after the trim
    await wal.close()
    wal, recs = await reopen(dev)
    assert [o for o, _ in recs] == written[10:]
    await wal.close()


async def test_full_device_in_wait_mode_waits_for_a_trim() -> None:
    config = WalConfig(**{**CONFIG.__dict__, "on_full": "wait"})
    wal = await BlockWAL.open(MemoryDevice(config.device_bytes), config)
    written = [await wal.append(body(i, 4000)) for i in range(AREA // 4096)]  # one block each: full
    blocked = asyncio.ensure_future(wal.append(body(1000, 4000)))
    await asyncio.sleep(0.05)
    assert not blocked.done()
    await wal.trim(written[20])
    assert await asyncio.wait_for(blocked, 5) > written[-1]
    await wal.close()


async def test_append_before_recover_is_refused() -> None:
    dev = MemoryDevice(CONFIG.device_bytes)
    wal = await BlockWAL.open(dev, CONFIG)
    await wal.append(b"a")
    await wal.close()
    wal = await BlockWAL.open(MemoryDevice(dev.size_bytes, dev.data), CONFIG)
    with pytest.raises(WalStateError):
        await wal.append(b"b")
    assert [r.data async for r in wal.recover()] == [b"a"]
    await wal.append(b"b")
    await wal.close()
    with pytest.raises(WalClosedError):
        await wal.append(b"c")


async def test_device_failure_fails_every_pending_append_and_later_calls() -> None:
    dev = FaultyDevice(CONFIG.device_bytes)
    wal = await BlockWAL.open(dev, CONFIG)
    await wal.append(b"ok")
    dev.fail_after_writes = 0
    results = await asyncio.gather(*(wal.append(body(i)) for i in range(50)), return_exceptions=True)
    assert all(isinstance(r, WalIOError) for r in results)
    with pytest.raises(WalClosedError):
        await wal.append(b"later")
    await wal.close()


async def test_stale_header_copy_is_used_when_the_newest_is_damaged() -> None:
    dev = MemoryDevice(CONFIG.device_bytes)
    wal = await BlockWAL.open(dev, CONFIG)
    offsets = [await wal.append(body(i)) for i in range(10)]
    await wal.trim(offsets[3])
    await wal.trim(offsets[6])  # newest header copy: trim at offsets[6]
    seqs = [decode_wal_header(dev.data[k * 4096 : (k + 1) * 4096]) for k in (0, 1)]
    await wal.close()
    # damage the copy written by close() and the trim before it: the trim to offsets[3] copy wins
    newest = max((h.seq, k) for k, h in enumerate(seqs) if h is not None)[1]
    closing_slot = 1 - newest
    dev.data[closing_slot * 4096 + 10] ^= 0xFF
    wal, recs = await reopen(dev)
    assert [o for o, _ in recs] == offsets[6:]
    await wal.close()


async def test_a_new_wal_has_two_header_copies_before_its_first_trim_or_close() -> None:
    """A damaged header in a WAL that never trimmed or closed (one session, then a crash) loses nothing."""
    for damaged_slot in (0, 1):
        dev = MemoryDevice(CONFIG.device_bytes)
        wal = await BlockWAL.open(dev, CONFIG)
        offsets = [await wal.append(body(i)) for i in range(5)]
        image = bytearray(dev.data)  # a crash: no trim, no clean close
        await wal.close()
        image[damaged_slot * 4096 + 10] ^= 0xFF
        wal, recs = await reopen(MemoryDevice(len(image), image))
        assert recs == [(o, body(i)) for i, o in enumerate(offsets)]
        await wal.close()


async def test_both_header_copies_damaged_is_corruption_not_a_new_wal() -> None:
    dev = MemoryDevice(CONFIG.device_bytes)
    wal = await BlockWAL.open(dev, CONFIG)
    await wal.append(b"x")
    await wal.close()
    dev.data[10] ^= 1
    dev.data[4096 + 10] ^= 1
    with pytest.raises(WalCorruptionError):
        await BlockWAL.open(MemoryDevice(dev.size_bytes, dev.data), CONFIG)


async def test_flipped_byte_in_a_middle_record_raises_corruption_with_position() -> None:
    dev = MemoryDevice(CONFIG.device_bytes)
    wal = await BlockWAL.open(dev, CONFIG)
    offsets = [await wal.append(body(i, 500)) for i in range(10)]
    await wal.close()
    pos = 8192 + offsets[4] + RECORD_HEADER_SIZE + 7
    dev.data[pos] ^= 0x10
    with pytest.raises(WalCorruptionError) as info:
        await reopen(dev)
    assert info.value.position == 8192 + offsets[4]


async def test_flipped_byte_in_last_record_after_clean_close_is_corruption() -> None:
    dev = MemoryDevice(CONFIG.device_bytes)
    wal = await BlockWAL.open(dev, CONFIG)
    offsets = [await wal.append(body(i, 500)) for i in range(3)]
    await wal.close()
    dev.data[8192 + offsets[-1] + 3] ^= 0x10
    with pytest.raises(WalCorruptionError):
        await reopen(dev)


async def test_torn_last_group_after_a_crash_is_the_end_of_the_log() -> None:
    rng = random.Random(3)
    modes: tuple[Literal["drop", "sectors", "tear"], ...] = ("drop", "sectors", "tear")
    for mode in modes:
        dev = FaultyDevice(CONFIG.device_bytes)
        wal = await BlockWAL.open(dev, CONFIG)
        acked = [await wal.append(body(i, 700)) for i in range(5)]
        tasks = [asyncio.ensure_future(wal.append(body(100 + i, 700))) for i in range(20)]
        await asyncio.sleep(0)
        done_before = {t.result() for t in tasks if t.done()}
        image = dev.crash(rng, mode)
        await wal.close()
        wal, recs = await reopen(MemoryDevice(len(image), image))
        got = dict(recs)
        for i, o in enumerate(acked):
            assert got[o] == body(i, 700)
        assert done_before <= set(got)
        for _, d in recs:
            assert d in {body(i, 700) for i in [*range(5), *range(100, 120)]}
        await wal.close()


async def test_bridge_after_a_crash_keeps_the_torn_tail_out_of_later_recoveries() -> None:
    dev = FaultyDevice(CONFIG.device_bytes)
    wal = await BlockWAL.open(dev, CONFIG)
    first = [await wal.append(body(i, 300)) for i in range(4)]
    tasks = [asyncio.ensure_future(wal.append(body(50 + i, 300))) for i in range(30)]
    await asyncio.sleep(0)
    image = dev.crash(random.Random(1), "sectors")
    await wal.close()
    for t in tasks:
        await asyncio.gather(t, return_exceptions=True)
    mem = MemoryDevice(len(image), image)
    wal, recs1 = await reopen(mem)
    assert [o for o, _ in recs1][:4] == first
    later = [await wal.append(body(200 + i, 300)) for i in range(5)]
    assert later[0] >= recs1[-1][0] + CONFIG.write_max_bytes  # new offsets lie beyond any torn write
    wal._device.close()  # crash again, without a clean close
    wal, recs2 = await reopen(mem)
    assert recs2 == recs1 + [(o, body(200 + i, 300)) for i, o in enumerate(later)]
    await wal.close()


async def test_new_wal_node_epoch_is_fenced_by_a_newer_header() -> None:
    dev = MemoryDevice(CONFIG.device_bytes)
    newer = WalConfig(**{**CONFIG.__dict__, "node_epoch": 5})
    wal = await BlockWAL.open(dev, newer)
    await wal.close()
    with pytest.raises(WalFencedError):
        await BlockWAL.open(MemoryDevice(dev.size_bytes, dev.data), CONFIG)


async def test_file_wal_is_created_zero_filled_locked_and_size_checked(tmp_path: Path) -> None:
    path = tmp_path / "wal.dat"
    wal = await BlockWAL.open(path, CONFIG)
    assert os.path.getsize(path) == CONFIG.device_bytes
    assert wal.mode == "buffered+O_DSYNC"  # direct_io="off"
    with pytest.raises(WalLockedError):
        await BlockWAL.open(path, CONFIG)
    o = await wal.append(b"persisted")
    await wal.close()
    other = WalConfig(**{**CONFIG.__dict__, "capacity_bytes": 512 << 10})
    with pytest.raises(InvalidWalConfig):
        await BlockWAL.open(path, other)
    wal = await BlockWAL.open(path, CONFIG)
    assert [(r.offset, r.data) async for r in wal.recover()] == [(o, b"persisted")]
    await wal.close()


def test_sync_facade_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "wal.dat"
    config = WalConfig(**{**CONFIG.__dict__, "direct_io": "auto"})
    with SyncBlockWAL(path, config) as wal:
        assert wal.recover() == []
        a = wal.append(b"a")
        b = wal.append_many([b"b", b"c"])
        wal.trim(b[0])
    with SyncBlockWAL(path, config) as wal:
        assert [(r.offset, r.data) for r in wal.recover()] == [(b[0], b"b"), (b[1], b"c")]
        assert a < b[0]


async def test_bounded_inflight_bytes_admit_a_larger_record_when_alone() -> None:
    config = WalConfig(**{**CONFIG.__dict__, "inflight_max_bytes": 4096})
    wal = await BlockWAL.open(MemoryDevice(config.device_bytes), config)
    big = await wal.append(bytes(6000))  # above the bound: admitted because nothing else is in flight
    results = await asyncio.gather(*(wal.append(body(i, 1000)) for i in range(30)))
    assert results == sorted(results)
    assert results[0] > big
    assert wal.stats["groups"] >= 8  # at most ~3 records of 1 KiB in flight at once
    await wal.close()


async def test_an_append_cancelled_while_waiting_for_room_takes_none_and_is_not_written() -> None:
    config = WalConfig(**{**CONFIG.__dict__, "inflight_max_bytes": 4096})
    dev = MemoryDevice(config.device_bytes)
    wal = await BlockWAL.open(dev, config)
    first = wal.append(body(1, 3000))  # admitted
    waiting = wal.append(body(2, 3000))  # over the bound: waits for room
    later = wal.append(body(3, 100))  # queues behind the waiting one (first come, first admitted)
    waiting.cancel()
    assert await first < await later
    assert waiting.cancelled()
    await wal.close()
    wal, recs = await reopen(dev, config)
    assert [d for _, d in recs] == [body(1, 3000), body(3, 100)]
    await wal.close()


async def _unclean_image(count: int) -> tuple[bytearray, list[int]]:
    """A device image after ``count`` single-record groups and no clean close (as after a crash)."""
    dev = FaultyDevice(CONFIG.device_bytes)
    wal = await BlockWAL.open(dev, CONFIG)
    offsets = [await wal.append(body(i, 500)) for i in range(count)]
    image = dev.crash(random.Random(0), "drop")  # everything was synced: nothing is lost
    await wal.close()
    return image, offsets


async def test_hole_followed_by_fewer_than_k_groups_is_a_torn_tail() -> None:
    assert CONFIG.groups_inflight_max == 2
    image, offsets = await _unclean_image(8)
    image[8192 + offsets[-2] + RECORD_HEADER_SIZE + 3] ^= 0x01  # one later group: could be in flight
    wal, recs = await reopen(MemoryDevice(len(image), image))
    assert [o for o, _ in recs] == offsets[:-2]
    await wal.close()


async def test_hole_followed_by_k_groups_is_corruption_with_position() -> None:
    image, offsets = await _unclean_image(8)
    image[8192 + offsets[-3] + RECORD_HEADER_SIZE + 3] ^= 0x01  # two later groups: no crash explains it
    with pytest.raises(WalCorruptionError) as info:
        await reopen(MemoryDevice(len(image), image))
    assert info.value.position == 8192 + offsets[-3]


async def test_append_in_parts_is_one_record_with_one_body_crc() -> None:
    dev = MemoryDevice(CONFIG.device_bytes)
    wal = await BlockWAL.open(dev, CONFIG)
    header, payload = b"HDR:", bytearray(body(7, 300))
    first, second, single = await asyncio.gather(  # one group: offsets show the record sizes
        wal.append([header, payload]),
        wal.append((memoryview(b"xyz"), b"", bytearray(b"!"))),
        wal.append(b"plain"),
    )
    assert second - first == RECORD_HEADER_SIZE + 304
    assert single - second == RECORD_HEADER_SIZE + 4
    await wal.close()
    wal, recs = await reopen(dev)
    assert recs == [(first, header + payload), (second, b"xyz!"), (single, b"plain")]
    await wal.close()
    # the stored body CRC covers the joined parts: flipping a payload byte is corruption
    dev.data[2 * CONFIG.block_size_bytes + RECORD_HEADER_SIZE + 10] ^= 0xFF
    with pytest.raises(WalCorruptionError):
        await reopen(dev)


async def test_memoryview_bodies_count_bytes_not_items() -> None:
    import array

    dev = MemoryDevice(CONFIG.device_bytes)
    wal = await BlockWAL.open(dev, CONFIG)
    words = array.array("I", range(10))  # 40 bytes, 10 items
    a, b = await asyncio.gather(wal.append(memoryview(words)), wal.append([memoryview(words), b"!"]))
    c = await wal.append_many([memoryview(words), memoryview(words)])
    assert b - a == RECORD_HEADER_SIZE + 40  # (one group: the appends of one loop turn)
    assert c[1] - c[0] == RECORD_HEADER_SIZE + 40
    await wal.close()
    wal, recs = await reopen(dev)
    assert [r[1] for r in recs] == [words.tobytes(), words.tobytes() + b"!", words.tobytes(), words.tobytes()]
    await wal.close()


async def test_non_contiguous_or_oversized_parts_are_argument_errors() -> None:
    wal = await BlockWAL.open(MemoryDevice(CONFIG.device_bytes), CONFIG)
    with pytest.raises(WalArgumentError):
        await wal.append(memoryview(bytes(100))[::2])
    with pytest.raises(WalArgumentError):
        await wal.append([b"ok", memoryview(bytes(100))[::2]])
    with pytest.raises(WalArgumentError):
        await wal.append([bytes(CONFIG.record_max_bytes), b"!"])
    with pytest.raises(WalArgumentError):
        await wal.append("text")  # type: ignore[arg-type]
    assert await wal.append([b"still", b" fine"]) == 0
    await wal.close()


async def test_small_and_large_bodies_mixed_in_one_group_round_trip() -> None:
    # bodies up to 4 KiB are joined with their headers, larger ones copied in place: mix both ways
    dev = MemoryDevice(CONFIG.device_bytes)
    wal = await BlockWAL.open(dev, CONFIG)
    sizes = [100, 5000, 4096, 4097, 1, 0, 6000, 300]
    singles = [body(i, n) for i, n in enumerate(sizes)]
    calls = [wal.append(b) if i % 3 else wal.append([b[:7], b[7:]]) for i, b in enumerate(singles)]
    many = [body(100 + i, n) for i, n in enumerate(reversed(sizes))]
    many_call = asyncio.ensure_future(wal.append_many(many))
    offsets = await asyncio.gather(*calls)
    many_offsets = await many_call
    assert wal.stats["groups"] < 5
    await wal.close()
    wal, recs = await reopen(dev)
    expected = sorted([*zip(offsets, singles, strict=True), *zip(many_offsets, many, strict=True)])
    assert recs == expected
    await wal.close()


async def test_a_group_of_single_appends_parts_and_append_many_reads_back_in_order() -> None:
    dev = MemoryDevice(CONFIG.device_bytes)
    wal = await BlockWAL.open(dev, CONFIG)
    a = wal.append(body(1))
    b = wal.append((body(2, 10), body(3, 20)))
    many = asyncio.ensure_future(wal.append_many([body(4), body(5)]))
    await asyncio.gather(a, b, many)
    assert wal.stats["groups"] <= 2
    await wal.close()
    wal, recs = await reopen(dev)
    assert [data for _, data in recs] == [body(1), body(2, 10) + body(3, 20), body(4), body(5)]
    await wal.close()


async def test_append_many_split_over_groups_between_single_appends_reads_back_in_order() -> None:
    """Groups with and without append_many calls, one of them cut across several groups: each is
    packed whole and the queue's count of append_many calls returns to zero."""
    dev = MemoryDevice(CONFIG.device_bytes)
    wal = await BlockWAL.open(dev, CONFIG)
    expected: list[bytes] = []
    for rnd in range(3):
        singles = [body(100 * rnd + i, 900) for i in range(5)]
        many = [body(100 * rnd + 50 + i, 700) for i in range(40)]  # about 29 KiB: several groups
        futs = [wal.append(b) for b in singles[:2]]
        many_call = asyncio.ensure_future(wal.append_many(many))
        await asyncio.sleep(0)
        futs += [wal.append(b) for b in singles[2:]]
        await asyncio.gather(*futs, many_call)
        expected += [*singles[:2], *many, *singles[2:]]
        assert wal._pending_many == 0
    await wal.close()
    wal, recs = await reopen(dev)
    assert [data for _, data in recs] == expected
    await wal.close()


async def test_io_threads_of_a_wal_never_closed_stop_once_it_is_unreachable() -> None:
    wal = await BlockWAL.open(MemoryDevice(CONFIG.device_bytes), CONFIG)
    await wal.append(body(1))
    threads = list(wal._threads)
    assert threads
    assert all(t.is_alive() for t in threads)
    del wal
    gc.collect()
    for thread in threads:
        thread.join(timeout=5)
        assert not thread.is_alive()


async def test_close_stops_and_joins_the_io_threads() -> None:
    wal = await BlockWAL.open(MemoryDevice(CONFIG.device_bytes), CONFIG)
    await wal.append(body(1))
    threads = list(wal._threads)
    await wal.close()
    assert not any(t.is_alive() for t in threads)


async def test_a_wal_never_closed_releases_its_file_and_lock_once_unreachable(tmp_path: Path) -> None:
    path = tmp_path / "wal.dat"
    fds = set(os.listdir("/proc/self/fd"))
    wal = await BlockWAL.open(path, CONFIG)
    offset = await wal.append(body(1))
    threads = list(wal._threads)
    del wal
    gc.collect()
    for thread in threads:
        thread.join(timeout=5)
    assert set(os.listdir("/proc/self/fd")) <= fds  # the descriptor is closed
    wal = await BlockWAL.open(path, CONFIG)  # and the lock released: no WalLockedError
    assert [(r.offset, r.data) async for r in wal.recover()] == [(offset, body(1))]
    await wal.close()


async def test_a_truncated_wal_file_is_corruption_and_another_capacity_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "wal.dat"
    wal = await BlockWAL.open(path, CONFIG)
    await wal.append(body(1))
    await wal.close()
    with pytest.raises(InvalidWalConfig, match="capacity cannot change"):  # the file is intact
        await BlockWAL.open(path, dataclasses.replace(CONFIG, capacity_bytes=2 * CONFIG.capacity_bytes))
    os.truncate(path, CONFIG.device_bytes - 4096)
    with pytest.raises(WalCorruptionError, match="truncated: it has 258048 bytes, its header records 262144"):
        await BlockWAL.open(path, CONFIG)


async def test_a_wal_dropped_before_recovery_releases_its_lock(tmp_path: Path) -> None:
    path = tmp_path / "wal.dat"
    wal = await BlockWAL.open(path, CONFIG)
    offset = await wal.append(body(2))
    await wal.close()
    wal = await BlockWAL.open(path, CONFIG)  # not recovered: no I/O threads yet
    del wal
    gc.collect()
    wal = await BlockWAL.open(path, CONFIG)
    assert [(r.offset, r.data) async for r in wal.recover()] == [(offset, body(2))]
    await wal.close()


async def test_close_closes_the_device_once() -> None:
    closes: list[int] = []

    class Counting(MemoryDevice):
        def close(self) -> None:
            closes.append(1)
            super().close()

    wal = await BlockWAL.open(Counting(CONFIG.device_bytes), CONFIG)
    await wal.append(body(1))
    await wal.close()
    await wal.close()
    del wal
    gc.collect()
    assert closes == [1]


class GatedDevice(MemoryDevice):
    """A memory device whose header writes (or record-area writes) wait for a gate to open."""

    def __init__(self, size_bytes: int) -> None:
        super().__init__(size_bytes)
        self.header_gate: threading.Event | None = None
        self.record_gate: threading.Event | None = None
        self.waiting = threading.Event()  # a write waits at a gate

    def write(self, pos: int, data: bytes | bytearray | memoryview | mmap.mmap) -> None:
        gate = self.header_gate if pos < 2 * CONFIG.block_size_bytes else self.record_gate
        if gate is not None:
            self.waiting.set()
            assert gate.wait(10), "gate never opened"
        super().write(pos, data)


async def test_appends_complete_while_a_trim_header_write_is_in_flight() -> None:
    config = WalConfig(**{**CONFIG.__dict__, "on_full": "wait"})
    dev = GatedDevice(config.device_bytes)
    wal = await BlockWAL.open(dev, config)
    written = [await wal.append(body(i, 4000)) for i in range(40)]  # one block each, 22 blocks free
    gate = dev.header_gate = threading.Event()
    trim = asyncio.ensure_future(wal.trim(written[20]))
    await asyncio.to_thread(dev.waiting.wait, 10)
    # groups are written while the header write is in flight (it held them back before)
    written += [await asyncio.wait_for(wal.append(body(i, 4000)), 5) for i in range(40, 62)]
    assert wal.used_bytes == AREA
    assert not trim.done()
    # the ring is full: the space the trim frees is not written before the header is durable
    before = bytes(dev.data)
    blocked = asyncio.ensure_future(wal.append(body(62, 4000)))
    await asyncio.sleep(0.05)
    assert not blocked.done()
    assert bytes(dev.data) == before
    gate.set()
    await trim
    assert await asyncio.wait_for(blocked, 5) > written[-1]
    await wal.close()
    wal, recs = await reopen(dev)
    assert recs == [(o, body(i, 4000)) for i, o in enumerate([*written, await blocked]) if i >= 20]
    await wal.close()


async def test_a_trim_header_naming_a_group_still_in_flight_recovers_after_a_crash() -> None:
    dev = GatedDevice(CONFIG.device_bytes)
    wal = await BlockWAL.open(dev, CONFIG)
    acked = [await wal.append(body(i, 700)) for i in range(6)]
    gate = dev.record_gate = threading.Event()
    in_flight = asyncio.ensure_future(wal.append(body(6, 700)))
    await asyncio.to_thread(dev.waiting.wait, 10)
    await asyncio.wait_for(wal.trim(acked[3]), 5)  # durable while the group is in flight
    image = bytearray(dev.data)  # a crash now: the group's write never happened
    # the header's start is that group when the trim drops every durable record
    group_start = wal.next_offset - wal.next_offset % CONFIG.block_size_bytes
    await asyncio.wait_for(wal.trim(group_start), 5)
    image_at_group = bytearray(dev.data)
    assert not in_flight.done()
    gate.set()
    assert await in_flight == group_start
    await wal.close()
    wal, recs = await reopen(MemoryDevice(len(image), image))
    assert recs == [(o, body(i, 700)) for i, o in enumerate(acked) if i >= 3]
    await wal.close()
    mem = MemoryDevice(len(image_at_group), image_at_group)
    wal, recs = await reopen(mem)
    assert recs == []  # the torn group is the end of the log
    later = await wal.append(body(7, 700))
    assert later >= group_start + CONFIG.block_size_bytes  # past the bridge: no offset is reused
    await wal.close()
    wal, recs = await reopen(mem)
    assert recs == [(later, body(7, 700))]
    await wal.close()


async def test_a_full_ring_waits_for_a_trim_header_in_flight_before_refusing_an_append() -> None:
    dev = GatedDevice(CONFIG.device_bytes)
    wal = await BlockWAL.open(dev, CONFIG)  # on_full="error"
    written = [await wal.append(body(i, 4000)) for i in range(AREA // 4096)]  # one block each: full
    gate = dev.header_gate = threading.Event()
    trim = asyncio.ensure_future(wal.trim(written[10]))
    await asyncio.to_thread(dev.waiting.wait, 10)
    later = asyncio.ensure_future(wal.append(body(1000, 4000)))
    await asyncio.sleep(0.05)
    assert not later.done()  # not refused: the header in flight frees room
    gate.set()
    await trim
    assert await asyncio.wait_for(later, 5) > written[-1]
    for i in range(9):  # the rest of the room the trim freed
        await wal.append(body(1001 + i, 4000))
    with pytest.raises(WalCapacityError):  # full again, with no trim in flight
        await wal.append(body(1010, 4000))
    await wal.close()
