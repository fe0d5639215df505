"""The ObjectStorage contract: one suite every backend must pass (memory, local, S3).

A backend's test module subclasses :class:`StorageContract` and provides a ``storage`` fixture
that yields an empty store whose listings page every ``LIST_PAGE_SIZE`` keys and (for S3) switches
to multipart above ``MULTIPART_THRESHOLD_BYTES``, so pagination and multipart are exercised with
small data. Keys here are relative; the S3 fixture puts them under a fresh prefix.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from s3stream.errors import ClosedError, ConflictError, InvalidArgumentError, NotFoundError
from s3stream.storage.base import MAX_DELETE_BATCH, MIN_PART_SIZE_BYTES, ObjectStorage

MiB = 1024 * 1024
LIST_PAGE_SIZE = 7
MULTIPART_THRESHOLD_BYTES = 6 * MiB
"""Backends that switch to multipart do so above this in the contract fixtures."""

BAD_KEYS = [
    "",
    "/abs",
    "a//b",
    "a/",
    "../escape",
    "a/../../b",
    "a/./b",
    ".",
    "..",
    "nul\x00byte",
    "ctl\x01x",
    "new\nline",
    "back\\slash",
    "sp ace",
    "tilde~",
    "ümlaut",
    "x" * 1025,
    "y" * 201,
    "ok/" + "z" * 201,
]


def payload(size: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(size)


async def keys_of(storage: ObjectStorage, prefix: str = "") -> list[str]:
    return [info.key async for info in storage.list(prefix)]


class StorageContract:
    """Subclasses provide an async ``storage`` fixture yielding an empty ObjectStorage."""

    # -- round trips -------------------------------------------------------------------------

    async def test_put_get_round_trip(self, storage: ObjectStorage) -> None:
        data = payload(1000, seed=1)
        await storage.put("obj/small", data)
        assert await storage.get("obj/small") == data
        await storage.put("obj/empty", b"")
        assert await storage.get("obj/empty") == b""
        assert (await storage.head("obj/empty")).size_bytes == 0

    async def test_put_accepts_bytearray_and_memoryview(self, storage: ObjectStorage) -> None:
        data = payload(4096, seed=2)
        await storage.put("a", bytearray(data))
        await storage.put("b", memoryview(data)[100:200])
        assert await storage.get("a") == data
        assert await storage.get("b") == data[100:200]

    async def test_put_overwrites(self, storage: ObjectStorage) -> None:
        await storage.put("k", b"first")
        await storage.put("k", b"second!")
        assert await storage.get("k") == b"second!"
        assert (await storage.head("k")).size_bytes == 7

    async def test_upload_larger_than_multipart_threshold_round_trips(self, storage: ObjectStorage) -> None:
        data = payload(MULTIPART_THRESHOLD_BYTES * 2 + 12345, seed=3)
        upload = storage.upload("big/object")
        position = 0
        rng = random.Random(4)
        while position < len(data):
            step = rng.choice([1, 100, 64 * 1024, 3 * MiB, 7 * MiB])
            chunk = data[position : position + step]
            kind = rng.randrange(3)
            await upload.write(chunk if kind == 0 else bytearray(chunk) if kind == 1 else memoryview(chunk))
            position += len(chunk)
        assert await upload.complete() == len(data)
        assert (await storage.head("big/object")).size_bytes == len(data)
        assert await storage.get("big/object") == data

    async def test_small_upload_round_trips(self, storage: ObjectStorage) -> None:
        upload = storage.upload("u/small")
        await upload.write(b"abc")
        await upload.write(memoryview(b"defg"))
        assert await upload.complete() == 7
        assert await storage.get("u/small") == b"abcdefg"

    async def test_upload_reusing_caller_buffer_keeps_written_bytes(self, storage: ObjectStorage) -> None:
        buffer = bytearray(b"x" * 1000)
        upload = storage.upload("u/reuse")
        await upload.write(buffer)
        buffer[:] = b"y" * 1000
        await upload.write(buffer)
        await upload.complete()
        assert await storage.get("u/reuse") == b"x" * 1000 + b"y" * 1000

    # -- bounded upload buffers (buffer_max_bytes) ---------------------------------------------

    @pytest.mark.parametrize(
        "buffer_max_bytes", [1, MIN_PART_SIZE_BYTES + 1, 2 * MIN_PART_SIZE_BYTES, 17 * MiB]
    )
    async def test_upload_with_a_buffer_limit_round_trips(
        self, storage: ObjectStorage, buffer_max_bytes: int
    ) -> None:
        """Writes and copies (server-side sized and small) under every regime of the limit: below one
        minimum part (inline parts), one to two parts, several parts in flight."""
        source = payload(2 * MIN_PART_SIZE_BYTES + 3 * MiB, seed=21)
        await storage.put("src", source)
        data = payload(3 * MIN_PART_SIZE_BYTES + 777, seed=22)
        upload = storage.upload("bounded", buffer_max_bytes=buffer_max_bytes)
        expected = bytearray()
        rng = random.Random(buffer_max_bytes)
        position = 0
        while position < len(data):
            step = rng.choice([1, 4096, 300 * 1024, 2 * MiB])
            chunk = data[position : position + step]
            await upload.write(memoryview(chunk) if rng.random() < 0.5 else chunk)
            expected += chunk
            position += len(chunk)
            if rng.random() < 0.1:
                start = rng.randrange(len(source) // 2)
                end = start + rng.choice([10, MIN_PART_SIZE_BYTES])
                await upload.copy("src", start, end)
                expected += source[start:end]
        await upload.copy("src", 0, MIN_PART_SIZE_BYTES + 5)
        expected += source[: MIN_PART_SIZE_BYTES + 5]
        assert await upload.complete() == len(expected)
        assert await storage.get("bounded") == expected

    async def test_small_upload_with_a_buffer_limit_is_one_object(self, storage: ObjectStorage) -> None:
        upload = storage.upload("tiny", buffer_max_bytes=MIN_PART_SIZE_BYTES)
        await upload.write(b"abc")
        assert await upload.complete() == 3
        assert await storage.get("tiny") == b"abc"

    @pytest.mark.parametrize("buffer_max_bytes", [0, -1, True, 1.5])
    async def test_bad_buffer_limits_are_invalid(
        self, storage: ObjectStorage, buffer_max_bytes: object
    ) -> None:
        with pytest.raises(InvalidArgumentError):
            storage.upload("never", buffer_max_bytes=buffer_max_bytes)  # type: ignore[arg-type]
        assert await keys_of(storage) == []

    # -- ranged reads ------------------------------------------------------------------------

    async def test_ranged_reads(self, storage: ObjectStorage) -> None:
        data = payload(10_000, seed=5)
        await storage.put("r", data)
        assert await storage.get("r", 0, 10_000) == data
        assert await storage.get("r", 17, 4242) == data[17:4242]
        assert await storage.get("r", 9_999, 10_000) == data[9_999:]
        assert await storage.get("r", 5000) == data[5000:]
        assert await storage.get("r", 5000, None) == data[5000:]
        assert await storage.get("r", 123, 123) == b""
        assert await storage.get("r", 10_000) == b""

    @pytest.mark.parametrize(
        ("start", "end"), [(0, 10_001), (9_000, 20_000), (10_001, None), (10_001, 10_002)]
    )
    async def test_reads_beyond_the_end_are_invalid(
        self, storage: ObjectStorage, start: int, end: int | None
    ) -> None:
        await storage.put("r", payload(10_000, seed=6))
        with pytest.raises(InvalidArgumentError):
            await storage.get("r", start, end)

    @pytest.mark.parametrize(("start", "end"), [(-1, None), (5, 4), (-3, 2)])
    async def test_malformed_ranges_are_invalid(
        self, storage: ObjectStorage, start: int, end: int | None
    ) -> None:
        await storage.put("r", b"0123456789")
        with pytest.raises(InvalidArgumentError):
            await storage.get("r", start, end)

    # -- head, missing keys --------------------------------------------------------------------

    async def test_head_reports_size_and_time(self, storage: ObjectStorage) -> None:
        await storage.put("h/x", payload(777))
        info = await storage.head("h/x")
        assert info.key == "h/x"
        assert info.size_bytes == 777
        assert info.last_modified_s > 1_600_000_000

    async def test_missing_keys(self, storage: ObjectStorage) -> None:
        with pytest.raises(NotFoundError):
            await storage.get("missing/key")
        with pytest.raises(NotFoundError):
            await storage.get("missing/key", 3, 9)
        with pytest.raises(NotFoundError):
            await storage.head("missing/key")
        await storage.delete(["missing/key"])  # deleting nothing is fine
        assert await keys_of(storage, "missing/") == []

    # -- delete and list -----------------------------------------------------------------------

    async def test_delete_in_batches_beyond_the_request_limit(self, storage: ObjectStorage) -> None:
        count = MAX_DELETE_BATCH + 5
        keys = [f"d/{i:05d}" for i in range(count)]
        sem = asyncio.Semaphore(32)

        async def put(key: str) -> None:
            async with sem:
                await storage.put(key, key.encode())

        await asyncio.gather(*(put(key) for key in keys))
        await storage.put("keep/me", b"1")
        await storage.delete([*keys[:500], "d/not-there", *keys[500:]])
        assert await keys_of(storage, "d/") == []
        assert await keys_of(storage) == ["keep/me"]

    async def test_list_pages_in_key_order_and_filters_by_prefix(self, storage: ObjectStorage) -> None:
        keys = [f"p/a/{i:03d}" for i in range(3 * LIST_PAGE_SIZE + 2)]
        others = ["p/ab", "p/a-z", "p/b/1", "q/a/1", "p/a0"]
        await asyncio.gather(*(storage.put(key, b"v" * (i + 1)) for i, key in enumerate(keys + others)))
        listed = [info async for info in storage.list("p/a/")]
        assert [info.key for info in listed] == keys
        assert [info.size_bytes for info in listed] == [i + 1 for i in range(len(keys))]
        assert await keys_of(storage, "p/a") == sorted([*keys, "p/ab", "p/a-z", "p/a0"])
        assert await keys_of(storage) == sorted(keys + others)
        assert await keys_of(storage, "p/a/00") == keys[:10]
        assert await keys_of(storage, "nothing/") == []

    # -- copy ----------------------------------------------------------------------------------

    async def test_copy_ranges_below_and_above_min_part(self, storage: ObjectStorage) -> None:
        source = payload(2 * MIN_PART_SIZE_BYTES + 3 * MiB, seed=7)
        await storage.put("src", source)
        upload = storage.upload("dst")
        pieces: list[bytes] = []
        steps: list[tuple[int, int] | bytes] = [
            b"header",
            (0, MIN_PART_SIZE_BYTES + 10),  # big copy after a small buffered write
            (10, 1000),  # small copy
            (MIN_PART_SIZE_BYTES, 2 * MIN_PART_SIZE_BYTES + 1),  # big copy
            b"middle" * 1000,
            (len(source) - 100, len(source)),  # small copy at the end of the source
            (0, MIN_PART_SIZE_BYTES),  # exactly the minimum part
        ]
        for step in steps:
            if isinstance(step, bytes):
                await upload.write(step)
                pieces.append(step)
            else:
                await upload.copy("src", *step)
                pieces.append(source[step[0] : step[1]])
        expected = b"".join(pieces)
        assert await upload.complete() == len(expected)
        assert await storage.get("dst") == expected

    async def test_small_copy_only_upload(self, storage: ObjectStorage) -> None:
        await storage.put("src", b"0123456789")
        upload = storage.upload("dst")
        await upload.copy("src", 2, 5)
        await upload.copy("src", 0, 10)
        assert await upload.complete() == 13
        assert await storage.get("dst") == b"2340123456789"

    async def test_copy_from_missing_source_fails_and_publishes_nothing(self, storage: ObjectStorage) -> None:
        upload = storage.upload("dst")
        await upload.write(b"abc")
        with pytest.raises(NotFoundError):
            await upload.copy("no/such/source", 0, 10)
        await upload.abort()
        with pytest.raises(NotFoundError):
            await storage.head("dst")

    async def test_copy_beyond_source_end_is_invalid(self, storage: ObjectStorage) -> None:
        await storage.put("src", b"0123456789")
        upload = storage.upload("dst")
        with pytest.raises(InvalidArgumentError):
            await upload.copy("src", 5, 11)
        await upload.abort()
        assert await keys_of(storage, "dst") == []

    # -- conditional create ----------------------------------------------------------------------

    async def test_conditional_create_race_has_exactly_one_winner(self, storage: ObjectStorage) -> None:
        writers = 16
        bodies = [f"writer-{i}".encode() * 100 for i in range(writers)]
        results = await asyncio.gather(
            *(storage.put("lock/owner", body, if_absent=True) for body in bodies), return_exceptions=True
        )
        winners = [i for i, result in enumerate(results) if result is None]
        assert len(winners) == 1, results
        assert all(isinstance(r, ConflictError) for i, r in enumerate(results) if i != winners[0]), results
        assert await storage.get("lock/owner") == bodies[winners[0]]

    async def test_conditional_create_of_existing_key_conflicts(self, storage: ObjectStorage) -> None:
        await storage.put("c", b"one", if_absent=True)
        with pytest.raises(ConflictError):
            await storage.put("c", b"two", if_absent=True)
        assert await storage.get("c") == b"one"
        await storage.delete(["c"])
        await storage.put("c", b"three", if_absent=True)
        assert await storage.get("c") == b"three"

    # -- key validation --------------------------------------------------------------------------

    async def test_bad_keys_are_rejected_everywhere(self, storage: ObjectStorage) -> None:
        await storage.put("fine", b"x")
        for key in BAD_KEYS:
            with pytest.raises(InvalidArgumentError):
                await storage.put(key, b"x")
            with pytest.raises(InvalidArgumentError):
                await storage.get(key)
            with pytest.raises(InvalidArgumentError):
                await storage.head(key)
            with pytest.raises(InvalidArgumentError):
                await storage.delete(["fine", key])
            with pytest.raises(InvalidArgumentError):
                storage.upload(key)
            upload = storage.upload("dst")
            with pytest.raises(InvalidArgumentError):
                await upload.copy(key, 0, 1)
        assert await keys_of(storage) == ["fine"]

    async def test_bad_prefixes_are_rejected(self, storage: ObjectStorage) -> None:
        for prefix in ["/a", "../", "a//", "a/../", "sp ace", "x\x00"]:
            with pytest.raises(InvalidArgumentError):
                await keys_of(storage, prefix)

    async def test_unusual_but_valid_keys_work(self, storage: ObjectStorage) -> None:
        keys = [
            "__automq/readiness_check/x",
            "a.b-c_d=e+f,g@h!i",
            "7a3f0000/0/123",
            "...dots",
            "/".join(["a" * 200] * 5),
        ]
        for key in keys:
            await storage.put(key, key.encode()[:10])
        assert await keys_of(storage) == sorted(keys)
        for key in keys:
            assert await storage.get(key) == key.encode()[:10]

    # -- visibility and abort ----------------------------------------------------------------------

    async def test_upload_is_invisible_until_complete(self, storage: ObjectStorage) -> None:
        upload = storage.upload("v/obj")
        await upload.write(payload(MULTIPART_THRESHOLD_BYTES + 1, seed=8))
        with pytest.raises(NotFoundError):
            await storage.head("v/obj")
        assert await keys_of(storage, "v/") == []
        await upload.complete()
        assert await keys_of(storage, "v/") == ["v/obj"]

    @pytest.mark.parametrize("size", [10, MULTIPART_THRESHOLD_BYTES * 2 + 1])
    async def test_abort_leaves_nothing_visible(self, storage: ObjectStorage, size: int) -> None:
        upload = storage.upload("ab/obj")
        await upload.write(payload(size, seed=9))
        await upload.abort()
        await upload.abort()  # idempotent
        with pytest.raises(NotFoundError):
            await storage.head("ab/obj")
        assert await keys_of(storage) == []

    async def test_finished_upload_rejects_more_calls(self, storage: ObjectStorage) -> None:
        upload = storage.upload("f")
        await upload.write(b"x")
        await upload.complete()
        with pytest.raises(ClosedError):
            await upload.write(b"y")
        with pytest.raises(ClosedError):
            await upload.complete()
        aborted = storage.upload("g")
        await aborted.abort()
        with pytest.raises(ClosedError):
            await aborted.write(b"y")
        assert await keys_of(storage) == ["f"]

    async def test_abort_after_complete_keeps_the_object(self, storage: ObjectStorage) -> None:
        upload = storage.upload("kept")
        await upload.write(b"data")
        await upload.complete()
        await upload.abort()
        assert await storage.get("kept") == b"data"
