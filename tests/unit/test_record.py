"""StreamRecordBatch codec: golden bytes (docs/format.md section 1), round trips, typed errors."""

from __future__ import annotations

import pytest

from s3stream.errors import CorruptionError
from s3stream.record import RECORD_HEADER_SIZE, StreamRecordBatch, decode_record

# docs/format.md section 1 (AutoMQ's worked example records A, B, C)
RECORD_A = StreamRecordBatch(stream_id=7, epoch=1, base_offset=100, count=2, payload=b"hello")
RECORD_A_HEX = "22000000000000000700000000000000010000000000000064000000020000000568656c6c6f"
RECORD_B = StreamRecordBatch(stream_id=7, epoch=1, base_offset=102, count=1, payload=b"abc")
RECORD_B_HEX = "220000000000000007000000000000000100000000000000660000000100000003616263"
RECORD_C = StreamRecordBatch(stream_id=9, epoch=3, base_offset=0, count=5, payload=b"xy")
RECORD_C_HEX = "2200000000000000090000000000000003000000000000000000000005000000027879"


@pytest.mark.parametrize(
    ("record", "golden_hex"), [(RECORD_A, RECORD_A_HEX), (RECORD_B, RECORD_B_HEX), (RECORD_C, RECORD_C_HEX)]
)
def test_record_encodes_to_automq_golden_bytes(record: StreamRecordBatch, golden_hex: str) -> None:
    golden = bytes.fromhex(golden_hex)
    assert record.encode() == golden
    assert record.encoded_size == len(golden)
    buf = bytearray(len(golden) + 3)
    assert record.encode_into(buf, 3) == len(buf)
    assert bytes(buf[3:]) == golden
    assert decode_record(golden) == (record, len(golden))


def test_record_sizes_match_the_worked_example() -> None:
    assert (RECORD_A.encoded_size, RECORD_B.encoded_size, RECORD_C.encoded_size) == (38, 36, 35)
    assert RECORD_HEADER_SIZE == 33
    assert RECORD_A.end_offset == 102


def test_decode_record_reads_at_a_position_and_returns_the_next() -> None:
    buf = RECORD_A.encode() + RECORD_B.encode()
    a, pos = decode_record(buf)
    b, end = decode_record(buf, pos)
    assert (a, b, end) == (RECORD_A, RECORD_B, len(buf))


def test_bad_magic_names_source_and_position() -> None:
    buf = bytearray(b"\0\0" + RECORD_A.encode())
    buf[2] = 0x23
    with pytest.raises(CorruptionError, match="magic") as info:
        decode_record(buf, 2, source="obj", base_position=100)
    assert (info.value.source, info.value.position) == ("obj", 102)


@pytest.mark.parametrize("cut", [0, 1, 32, 33, 37])
def test_truncated_record_is_corruption(cut: int) -> None:
    with pytest.raises(CorruptionError, match="truncated") as info:
        decode_record(RECORD_A.encode()[:cut], source="wal")
    assert info.value.position == 0


@pytest.mark.parametrize(("offset", "field_hex"), [(25, "ffffffff"), (29, "ffffffff"), (17, "ff" * 8)])
def test_negative_count_length_or_offset_is_corruption(offset: int, field_hex: str) -> None:
    buf = bytearray(RECORD_A.encode())
    field = bytes.fromhex(field_hex)
    buf[offset : offset + len(field)] = field
    with pytest.raises(CorruptionError, match="negative"):
        decode_record(buf)


def test_decoded_payload_is_a_copy_not_a_view() -> None:
    buf = bytearray(RECORD_B.encode())
    record, _ = decode_record(memoryview(buf))
    buf[-1] = 0
    assert record.payload == b"abc"
    assert type(record.payload) is bytes
