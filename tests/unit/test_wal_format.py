"""WAL codecs: golden bytes, round trips, byte surgery on headers, config limits."""

from __future__ import annotations

import random

import pytest

from wal import InvalidWalConfig, WalConfig
from wal.format import (
    DATA_MAGIC,
    FLAG_FIRST,
    JOIN_BODY_MAX,
    NO_CLEAN_END,
    PAD_MAGIC,
    RECORD_HEADER_SIZE,
    WAL_HEADER_SIZE,
    RecordPacker,
    WalHeader,
    decode_record_header,
    decode_wal_header,
    encode_padding,
    encode_record,
    encode_wal_header,
)

WAL_ID = 0x0A0B0C0D
GOLDEN_RECORD = (
    bytes.fromhex("57414c52010100000a0b0c0d000000000000000500000000000020009a71bb4c56738516") + b"hello"
)
GOLDEN_PADDING = bytes.fromhex("57414c50010100000a0b0c0d0000000000003000000000000000100000000000e3506c7b")
GOLDEN_HEADER_FIELDS = WalHeader(
    seq=7,
    wal_id=WAL_ID,
    block_size=4096,
    capacity=1 << 20,
    node_id=1,
    inflight_groups=2,
    node_epoch=5,
    trim_offset=100,
    start_offset=0,
    window=69632,
    clean_end_offset=NO_CLEAN_END,
)
GOLDEN_HEADER = bytes.fromhex(
    "57414c48"
    "0001"
    "0000"
    "0000000000000007"
    "0a0b0c0d"
    "00001000"
    "0000000000100000"
    "00000001"
    "00000002"
    "0000000000000005"
    "0000000000000064"
    "0000000000000000"
    "0000000000011000"
    "ffffffffffffffff"
    "3dbdfb51"
)


def test_record_golden_bytes() -> None:
    assert encode_record(body=b"hello", offset=8192, wal_id=WAL_ID, first=True) == GOLDEN_RECORD
    h = decode_record_header(GOLDEN_RECORD)
    assert h is not None
    assert (h.magic, h.flags, h.wal_id, h.length, h.offset) == (DATA_MAGIC, FLAG_FIRST, WAL_ID, 5, 8192)


def test_padding_golden_bytes() -> None:
    assert encode_padding(offset=4096, length=12288, wal_id=WAL_ID) == GOLDEN_PADDING
    h = decode_record_header(GOLDEN_PADDING)
    assert h is not None
    assert (h.magic, h.length, h.offset, h.body_crc) == (PAD_MAGIC, 12288, 4096, 0)


def test_wal_header_golden_bytes_and_round_trip() -> None:
    assert len(GOLDEN_HEADER) == WAL_HEADER_SIZE
    assert encode_wal_header(GOLDEN_HEADER_FIELDS) == GOLDEN_HEADER
    assert decode_wal_header(GOLDEN_HEADER) == GOLDEN_HEADER_FIELDS


@pytest.mark.parametrize("index", range(RECORD_HEADER_SIZE))
def test_record_header_any_flipped_byte_is_rejected(index: int) -> None:
    damaged = bytearray(GOLDEN_RECORD)
    damaged[index] ^= 0x40
    assert decode_record_header(damaged) is None


@pytest.mark.parametrize("index", range(WAL_HEADER_SIZE))
def test_wal_header_any_flipped_byte_is_rejected(index: int) -> None:
    damaged = bytearray(GOLDEN_HEADER)
    damaged[index] ^= 0x01
    assert decode_wal_header(damaged) is None


@pytest.mark.parametrize("cut", [0, 1, RECORD_HEADER_SIZE - 1])
def test_truncated_record_header_is_rejected(cut: int) -> None:
    assert decode_record_header(GOLDEN_RECORD[:cut]) is None


def test_truncated_wal_header_is_rejected() -> None:
    assert decode_wal_header(GOLDEN_HEADER[:-1]) is None


def test_record_packer_writes_the_golden_record() -> None:
    buf = bytearray(len(GOLDEN_RECORD))
    assert RecordPacker(WAL_ID).pack(memoryview(buf), 0x2000, [b"hello"]) == [
        0x2000,
        0x2000 + len(GOLDEN_RECORD),
    ]
    assert bytes(buf) == GOLDEN_RECORD


@pytest.mark.parametrize("seed", range(40))
def test_record_packer_writes_the_bytes_of_encode_record_for_any_mix_of_bodies(seed: int) -> None:
    """Small bodies joined, large ones and parts copied in place, any kind of bytes-like object: the same
    bytes as one :func:`encode_record` per record, the first flagged FIRST."""
    rng = random.Random(seed)
    bodies: list[bytes | bytearray | memoryview | tuple[bytes | memoryview, ...]] = []
    joined: list[bytes] = []
    for _ in range(rng.randint(1, 12)):
        data = rng.randbytes(rng.choice([0, 1, 100, JOIN_BODY_MAX, JOIN_BODY_MAX + 1, 9000]))
        kind = rng.randrange(4)
        if kind == 0:
            cut = rng.randint(0, len(data))
            bodies.append((data[:cut], memoryview(data[cut:])))
        else:
            bodies.append((bytes, bytearray, memoryview)[kind - 1](data))
        joined.append(data)
    offset = rng.randrange(1 << 40)
    buf = bytearray(sum(RECORD_HEADER_SIZE + len(b) for b in joined))
    offsets = RecordPacker(WAL_ID).pack(memoryview(buf), offset, bodies)
    expected = b"".join(
        encode_record(body=data, offset=off, wal_id=WAL_ID, first=i == 0)
        for i, (data, off) in enumerate(zip(joined, offsets, strict=False))
    )
    assert bytes(buf) == expected, f"seed {seed}"
    assert offsets[-1] == offset + len(expected)


def test_zeroed_bytes_are_no_record() -> None:
    assert decode_record_header(bytes(64)) is None
    assert decode_wal_header(bytes(4096)) is None


@pytest.mark.parametrize(
    "kwargs",
    [
        {"block_size_bytes": 3000},
        {"capacity_bytes": 1000},
        {"record_max_bytes": 0},
        {"capacity_bytes": 1 << 20, "record_max_bytes": 1 << 20},  # two largest writes do not fit
        {"inflight_max_bytes": 1 << 10},  # below one block
        {"io_threads": 0},
        {"on_full": "drop"},
        {"direct_io": "yes"},
        {"node_epoch": -1},
        {"capacity_bytes": True},
    ],
)
def test_config_rejects_out_of_range_values(kwargs: dict[str, object]) -> None:
    with pytest.raises(InvalidWalConfig):
        WalConfig(**kwargs)  # type: ignore[arg-type]


def test_config_rounds_capacity_down_to_blocks() -> None:
    config = WalConfig(capacity_bytes=(8 << 20) + 1000, record_max_bytes=1 << 20, inflight_max_bytes=4 << 20)
    assert config.device_bytes == 8 << 20
    assert config.record_area_bytes == (8 << 20) - 8192
    assert config.write_max_bytes % 4096 == 0
    assert config.groups_inflight_max == 2
    assert config.window_bytes == 3 * config.write_max_bytes
