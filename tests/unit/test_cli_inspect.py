"""``s3stream inspect object``: text and JSON dumps of real files, clean errors for damaged objects."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from s3stream.cli import main
from s3stream.cli.inspect import inspect_object
from s3stream.errors import NotFoundError
from s3stream.objectformat import ObjectWriter
from s3stream.record import StreamRecordBatch
from s3stream.storage.memory import MemoryObjectStorage
from tests.support.s3 import S3TestServer
from tests.unit.test_objectformat import AUTOMQ_OBJECT, OBJECT


@pytest.fixture
def object_file(tmp_path: Path) -> Path:
    path = tmp_path / "43210000" / "DEFAULT" / "4660"
    path.parent.mkdir(parents=True)
    path.write_bytes(OBJECT)
    return path


def _damaged(tmp_path: Path, position: int) -> Path:
    data = bytearray(OBJECT)
    data[position] ^= 0x10
    path = tmp_path / f"damaged-{position}"
    path.write_bytes(bytes(data))
    return path


def test_text_dump_shows_footer_index_and_records(
    object_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["inspect", "object", str(object_file)]) == 0
    out = capsys.readouterr().out
    assert "273 bytes, 2 data blocks" in out
    assert "index position 129, index length 72 (2 entries)" in out
    assert "checksum section 24 bytes at 201 (CRC32C 0xea603a55)" in out
    lines = [line.split() for line in out.splitlines()]
    assert ["0", "7", "100", "103", "2", "0", "84", "56438ea9"] in lines  # index entry 0
    assert ["1", "9", "0", "5", "1", "84", "45", "446b01ce"] in lines  # index entry 1
    assert ["100", "2", "5", "1"] in lines  # record A: base, count, payload bytes, epoch
    assert ["102", "1", "3", "1"] in lines  # record B
    assert ["0", "5", "2", "3"] in lines  # record C


def test_json_dump_of_an_automq_object(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "automq"
    path.write_bytes(AUTOMQ_OBJECT)
    assert main(["inspect", "object", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["size_bytes"] == 249
    assert doc["has_checksums"] is False
    assert doc["footer"] == {
        "index_position": 129,
        "index_length": 72,
        "checksum_section_length": 0,
        "checksum_section_crc32c": None,
    }
    assert doc["index"][1] == {
        "stream_id": 9,
        "start_offset": 0,
        "end_offset": 5,
        "record_count": 1,
        "start_position": 84,
        "size_bytes": 45,
    }
    assert doc["blocks"][0]["records"] == [
        {"base_offset": 100, "count": 2, "payload_bytes": 5, "epoch": 1},
        {"base_offset": 102, "count": 1, "payload_bytes": 3, "epoch": 1},
    ]
    assert doc["blocks"][1]["error"] is None


def test_index_only_skips_block_reads(object_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", "object", str(object_file), "--json", "--index-only"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert "blocks" not in doc
    assert [e["crc32c"] for e in doc["index"]] == [0x56438EA9, 0x446B01CE]


def test_damaged_block_is_reported_in_place_and_exits_nonzero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["inspect", "object", str(_damaged(tmp_path, 100)), "--json"]) == 2
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert doc["blocks"][0]["error"] is None
    assert "data block CRC32C mismatch" in doc["blocks"][1]["error"]
    assert doc["blocks"][1]["records"] is None
    assert "at byte 84" in captured.err


@pytest.mark.parametrize(("position", "message"), [(130, "index block CRC32C"), (270, "footer magic")])
def test_damaged_tail_is_one_clear_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], position: int, message: str
) -> None:
    assert main(["inspect", "object", str(_damaged(tmp_path, position))]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert message in captured.err
    assert len(captured.err.strip().splitlines()) == 1


def test_missing_file_and_bad_uri_are_clean_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["inspect", "object", str(tmp_path / "nope")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["inspect", "object", "s3://bucket-only"]) == 2
    assert "s3://bucket/key" in capsys.readouterr().err
    assert main(["inspect", "object", "s3://]bucket/key"]) == 2  # a ValueError escaped here before
    assert "s3://bucket/key" in capsys.readouterr().err
    assert main(["inspect", "object", str(tmp_path)]) == 2
    assert "not a regular file" in capsys.readouterr().err


def test_corrupt_object_never_prints_a_traceback(tmp_path: Path) -> None:
    truncated = tmp_path / "truncated"
    truncated.write_bytes(OBJECT[:200])
    proc = subprocess.run(
        [sys.executable, "-m", "s3stream", "inspect", "object", str(truncated)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "footer magic" in proc.stderr


async def test_many_blocks_are_read_in_batches(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    storage = MemoryObjectStorage()
    writer = ObjectWriter(storage.upload("o"), block_size_bytes=1)
    await writer.write([StreamRecordBatch(1, 0, i, 1, b"x") for i in range(150)])
    await writer.close()
    data = bytearray(await storage.get("o"))
    position = data.index(bytes([0x22]), 120 * 44)  # a record header inside a late block
    data[position] ^= 0x01
    path = tmp_path / "many"
    path.write_bytes(bytes(data))
    code = await inspect_object(str(path), as_json=False, records=True, out=sys.stdout)
    out = capsys.readouterr().out
    assert code == 2
    assert out.count("CORRUPT") == 1
    assert sum(line.startswith("block ") for line in out.splitlines()) == 150


@pytest.mark.integration
async def test_s3_uri_reads_through_the_s3_backend(
    s3_server: S3TestServer,
    s3_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    storage = s3_server.storage()
    key = s3_prefix + "43210000/DEFAULT/4660"
    try:
        await storage.put(key, OBJECT)
        monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
        monkeypatch.setenv("S3STREAM_S3_ENDPOINT", s3_server.endpoint)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server.access_key)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.secret_key)
        monkeypatch.setenv("AWS_REGION", s3_server.region)
        uri = f"s3://{s3_server.bucket}/{key}"
        assert await inspect_object(uri, as_json=True, records=True, out=sys.stdout) == 0
        doc = json.loads(capsys.readouterr().out)
        assert doc["object"] == key
        assert doc["size_bytes"] == len(OBJECT)
        assert [len(b["records"]) for b in doc["blocks"]] == [2, 1]
        with pytest.raises(NotFoundError):
            await inspect_object(uri + "-missing", as_json=False, records=True, out=sys.stdout)
    finally:
        await storage.delete([key])
        await storage.close()
