"""Kafka RecordBatch v2 codec: golden fields, cross-checks with kafka-python, byte surgery."""

from __future__ import annotations

import random
import struct
import warnings

import pytest

from s3stream.errors import CorruptionError, InvalidArgumentError
from spark_sink import kafka_codec as kc

with warnings.catch_warnings():  # kafka-python's import chatter (importlib.resources.read_text)
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder


def _sample(n: int = 50, seed: int = 7) -> tuple[list[bytes | None], list[bytes | None], list[int], list]:
    rng = random.Random(seed)
    keys = [None if i % 5 == 0 else rng.randbytes(rng.randrange(0, 40)) for i in range(n)]
    values = [None if i % 11 == 3 else rng.randbytes(rng.randrange(0, 3000)) for i in range(n)]
    timestamps = [1_700_000_000_000 + rng.randrange(-5000, 5000) for _ in range(n)]
    headers = [
        None if i % 2 else [(f"h{j}-ü", None if j == 1 else rng.randbytes(j * 3)) for j in range(i % 4)]
        for i in range(n)
    ]
    return keys, values, timestamps, headers


def test_header_struct_matches_kafka_layout() -> None:
    assert kc.BATCH_HEADER.format == DefaultRecordBatch.HEADER_STRUCT.format
    assert kc.ATTRIBUTES_OFFSET == DefaultRecordBatch.ATTRIBUTES_OFFSET
    assert kc.CRC_OFFSET == DefaultRecordBatch.CRC_OFFSET


def test_kafka_python_decodes_our_batches() -> None:
    keys, values, timestamps, headers = _sample()
    buf = kc.encode_batch(keys, values, timestamps, headers, base_offset=1234, partition_leader_epoch=9)
    batch = DefaultRecordBatch(buf)
    assert batch.validate_crc()
    assert batch.magic == 2
    assert batch.base_offset == 1234
    assert batch.leader_epoch == 9
    assert batch.records_count == len(values)
    assert batch.last_offset_delta == len(values) - 1
    assert batch.first_timestamp == timestamps[0]
    assert batch.max_timestamp == max(timestamps)
    assert batch.producer_id == -1
    assert batch.producer_epoch == -1
    assert batch.base_sequence == -1
    assert batch.compression_type == 0
    assert not batch.is_transactional
    assert batch.size_in_bytes == len(buf)
    records = list(batch)
    assert [r.offset for r in records] == list(range(1234, 1234 + len(values)))
    assert [r.key for r in records] == keys
    assert [r.value for r in records] == values
    assert [r.timestamp for r in records] == timestamps
    assert [r.headers for r in records] == [list(h or []) for h in headers]


def test_we_decode_kafka_python_batches() -> None:
    keys, values, timestamps, headers = _sample(seed=3)
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=False,
        producer_id=77,
        producer_epoch=3,
        base_sequence=10,
        batch_size=1 << 30,
    )
    for i, (k, v, t, h) in enumerate(zip(keys, values, timestamps, headers, strict=True)):
        assert builder.append(i, timestamp=t, key=k, value=v, headers=list(h or [])) is not None
    buf = bytes(builder.build())
    decoded, end = kc.decode_batch(buf)
    assert end == len(buf)
    assert decoded.producer_id == 77
    assert decoded.producer_epoch == 3
    assert decoded.base_sequence == 10
    assert decoded.keys == keys
    assert decoded.values == values
    assert decoded.timestamps_ms == timestamps
    assert decoded.headers == [list(h or []) for h in headers]
    assert decoded.offsets == list(range(len(values)))


def test_base_offset_override_and_patch() -> None:
    buf = bytearray(kc.encode_batch([None, b"k"], [b"a", b"b"], [5, 6]))
    kc.set_base_offset(buf, 0, 500)
    decoded, _ = kc.decode_batch(buf)  # the CRC does not cover the base offset
    assert decoded.offsets == [500, 501]
    decoded, _ = kc.decode_batch(buf, base_offset=9)
    assert decoded.offsets == [9, 10]


def test_back_to_back_batches_decode_in_order() -> None:
    a = kc.encode_batch([None], [b"x"], [1])
    b = kc.encode_batch([b"k"], [b"y"], [2], base_offset=1)
    batches = kc.decode_batches(a + b)
    assert [bt.values for bt in batches] == [[b"x"], [b"y"]]
    assert kc.batch_size_at(a + b, len(a)) == len(b)
    assert kc.batch_size_at(a[:11]) is None


@pytest.mark.parametrize("n", [0, -1, 1, 63, 64, 65535, 65536, -(1 << 63), (1 << 63) - 1, 1 << 40])
def test_varint_round_trip(n: int) -> None:
    enc = kc.varint(n)
    assert kc.decode_varint(enc, 0) == (n, len(enc))


def test_the_table_of_small_varints_is_the_encoding_of_each_value() -> None:
    table = kc._small()
    assert len(table) == 1 << 16
    assert all(table[n] == kc._zigzag_varint(n) for n in range(1 << 16))


def test_varint_out_of_range_is_invalid() -> None:
    with pytest.raises(InvalidArgumentError):
        kc.varint(1 << 63)


def test_empty_or_ragged_input_is_invalid() -> None:
    with pytest.raises(InvalidArgumentError, match="at least one"):
        kc.encode_batch([], [], [])
    with pytest.raises(InvalidArgumentError, match="same length"):
        kc.encode_batch([None], [b"a", b"b"], [1, 2])


def test_flipped_byte_in_records_fails_crc() -> None:
    buf = bytearray(kc.encode_batch([b"key"], [b"value"], [1]))
    buf[-3] ^= 0x40
    with pytest.raises(CorruptionError, match="CRC"):
        kc.decode_batch(buf, source="payload-x")


def test_truncation_is_corruption_naming_source() -> None:
    buf = kc.encode_batch([b"key"], [b"value" * 10], [1])
    for cut in (0, 5, kc.BATCH_HEADER_SIZE - 1, kc.BATCH_HEADER_SIZE + 3, len(buf) - 1):
        with pytest.raises(CorruptionError, match="stream 4"):
            kc.decode_batch(buf[:cut], source="stream 4")


def test_wrong_magic_is_corruption() -> None:
    buf = bytearray(kc.encode_batch([None], [b"v"], [1]))
    buf[kc.CRC_OFFSET - 1] = 1
    with pytest.raises(CorruptionError, match="magic 1"):
        kc.decode_batch(buf)


def _recrc(buf: bytearray) -> bytearray:
    import crc32c

    struct.pack_into(">I", buf, kc.CRC_OFFSET, crc32c.crc32c(bytes(buf[kc.ATTRIBUTES_OFFSET :])))
    return buf


def test_compressed_batch_is_rejected_with_a_clear_error() -> None:
    buf = bytearray(kc.encode_batch([None], [b"v"], [1]))
    struct.pack_into(">h", buf, kc.ATTRIBUTES_OFFSET, 1)
    with pytest.raises(CorruptionError, match="compressed"):
        kc.decode_batch(_recrc(buf))


def test_record_count_larger_than_records_is_corruption() -> None:
    buf = bytearray(kc.encode_batch([None], [b"v"], [1]))
    struct.pack_into(">i", buf, kc.BATCH_HEADER_SIZE - 4, 2)
    with pytest.raises(CorruptionError, match="bad Kafka record"):
        kc.decode_batch(_recrc(buf))


def test_trailing_bytes_after_records_are_corruption() -> None:
    buf = bytearray(kc.encode_batch([None], [b"v"], [1])) + b"\x00"
    struct.pack_into(">i", buf, 8, len(buf) - 12)
    with pytest.raises(CorruptionError, match="after the last record"):
        kc.decode_batch(_recrc(buf))


def test_log_append_time_uses_max_timestamp() -> None:
    buf = bytearray(kc.encode_batch([None, None], [b"a", b"b"], [10, 30]))
    struct.pack_into(">h", buf, kc.ATTRIBUTES_OFFSET, kc.TIMESTAMP_TYPE_MASK)
    decoded, _ = kc.decode_batch(_recrc(buf))
    assert decoded.timestamps_ms == [30, 30]
    assert decoded.records()[0] == kc.KafkaRecord(0, 30, None, b"a", ())


def test_worked_example_of_docs_spark_sink_md() -> None:
    """docs/spark-sink.md, "Payload format": the worked example's bytes."""
    buf = kc.encode_batch([None], [b"v"], [5])
    assert len(buf) == 69
    assert bytes(buf[kc.BATCH_HEADER_SIZE :]) == bytes.fromhex("0e 00 00 00 01 02 76 00")
    assert struct.unpack_from(">i", buf, 8)[0] == 57
    fields = kc.BATCH_HEADER.unpack_from(buf)
    assert fields[3] == 2  # magic
    assert fields[1:3] == (57, -1)  # length, partition leader epoch
    assert fields[5:] == (0, 0, 5, 5, -1, -1, -1, 1)


def test_docs_table_matches_the_header_struct() -> None:
    """Every offset in the doc's header table is the struct's."""
    from pathlib import Path

    doc = (Path(__file__).parents[2] / "docs" / "spark-sink.md").read_text()
    table = doc[doc.index("| offset | size | field |") :].split("\n\n")[0].splitlines()[2:]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table]
    fmt = kc.BATCH_HEADER.format.lstrip(">")
    offset = 0
    for row, code in zip(rows, fmt, strict=False):
        size = struct.calcsize(">" + code)
        assert (int(row[0]), int(row[1])) == (offset, size), row
        offset += size
    assert int(rows[len(fmt)][0]) == kc.BATCH_HEADER_SIZE
