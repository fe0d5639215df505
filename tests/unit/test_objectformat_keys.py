"""Object keys: AutoMQ's reversed-hex scheme (docs/format.md section 3)."""

from __future__ import annotations

import pytest

from s3stream.errors import InvalidArgumentError
from s3stream.objectformat import object_key, parse_object_key


@pytest.mark.parametrize(
    ("object_id", "namespace", "key"),
    [
        (4660, "ns", "43210000/ns/4660"),
        (0, "DEFAULT", "00000000/DEFAULT/0"),
        (1, "_kafka_abc-XYZ", "10000000/_kafka_abc-XYZ/1"),
        (0x1_0000_0000, "ns", "000000001/ns/4294967296"),
    ],
)
def test_object_key_matches_automq(object_id: int, namespace: str, key: str) -> None:
    assert object_key(object_id, namespace) == key
    assert parse_object_key(key) == (object_id, namespace)


def test_default_namespace() -> None:
    assert object_key(4660) == "43210000/DEFAULT/4660"


@pytest.mark.parametrize(
    "key",
    [
        "",
        "43210000/ns",
        "43210000/ns/4660/x",
        "43210001/ns/4660",
        "43210000//4660",
        "43210000/ns/04660",
        "43210000/ns/+4660",
        "43210000/n s/4660",
        "00001234/ns/4660",
        "ffffffffffffffff/ns/18446744073709551615",
    ],
)
def test_parse_object_key_rejects_anything_else(key: str) -> None:
    with pytest.raises(InvalidArgumentError):
        parse_object_key(key)


@pytest.mark.parametrize(
    ("object_id", "namespace"),
    [(-1, "ns"), (1 << 63, "ns"), (True, "ns"), (1, ""), (1, "a/b"), (1, "."), (1, ".."), (1, "n" * 201)],
)
def test_object_key_rejects_bad_ids_and_namespaces(object_id: int, namespace: str) -> None:
    with pytest.raises(InvalidArgumentError):
        object_key(object_id, namespace)
