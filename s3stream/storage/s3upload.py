"""S3Upload: one object written in pieces to S3, as one PUT or as a multipart upload.

The writer follows AutoMQ's ProxyWriter / MultiPartWriter (``docs/automq-model.md`` section 14):

* **Staged** while the total stays <= the staging limit, ``min(multipart_threshold_bytes,
  part_concurrency_max * part_size_bytes)``: written bytes are kept and copies are kept as ranges;
  ``complete`` range-reads the copies and issues a single PutObject. (The second term keeps a
  staged upload from holding more than a multipart one would: with 5 MiB parts and one in flight,
  a long streamed object goes multipart as soon as its first part is full.)
* **Multipart** as soon as a write or copy would take the total past the staging limit: the staged
  operations are replayed in order (written bytes become the first part(s) without a copy). Writes fill the current part; a part is sent once it holds
  ``part_size_bytes``. A copy ``[start, end)`` (split into <= 5 GiB chunks) becomes: with no
  buffered part, an UploadPartCopy if the chunk is >= 5 MiB, else a range read into the buffer; with
  a buffered part that the chunk would push past ``part_size_bytes``, a range read that tops the
  buffer up to 5 MiB, the part sent, and the rest as UploadPartCopy (or read, if < 5 MiB);
  otherwise a range read into the buffer.

Memory (the bound compaction relies on): written bytes are copied exactly once, into pages of at
most ``PAGE_BYTES`` that the upload owns; nothing of the caller's buffer is kept, except a whole
immutable ``bytes`` object (kept by reference: it pins only itself); a large write lets the
event loop run between pages. Pages are never joined: a
body is a list of page slices that botocore reads through :class:`~s3stream.storage.s3body.PiecesReader`
and aiohttp sends as memoryviews (:mod:`s3stream.storage.s3body`). So an upload holds at most
``(part_concurrency_max + 1) * part_size_bytes`` plus one page of written bytes in either mode
(``write`` waits for a free part slot); staged copies are read only at ``complete``.

A caller may bound an upload's buffers (``ObjectStorage.upload(key, buffer_max_bytes=...)``):
:func:`upload_shape` then picks the part size, parts in flight and staging limit so that
``(part_concurrency_max + 1) * part_size_bytes <= buffer_max_bytes`` (keeping the configured part
size while two parts fit, else smaller parts, never below ``MIN_PART_SIZE_BYTES``). Below two
minimum parts the upload sends each part inline (``part_concurrency_max`` 0: ``write`` waits for
the part to be stored), holding one part; below one minimum part it still holds one 5 MiB part.
A partly filled page is trimmed when it is sealed, so page tails do not add up.

Any failure of a part, a copy or ``complete`` aborts the upload (AbortMultipartUpload) before the
error is raised: nothing of the object ever becomes visible. The object's size is our own tally;
the ETag of CompleteMultipartUpload is never read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from s3stream.errors import ClosedError, ConflictError, InvalidArgumentError, NotFoundError, S3StreamError
from s3stream.logfmt import log_event
from s3stream.storage.base import (
    MAX_PART_COUNT,
    MAX_PART_SIZE_BYTES,
    MIN_PART_SIZE_BYTES,
    ObjectInfo,
    check_buffer_max_bytes,
)
from s3stream.storage.keys import resolve_range, validate_key, validate_range
from s3stream.storage.s3body import BodyDigests, Piece, PiecesReader, digest_params
from s3stream.storage.s3client import S3Config
from s3stream.storage.stats import StorageStats

T = TypeVar("T")
log = logging.getLogger(__name__)

PAGE_BYTES = 1024 * 1024
"""Largest page written bytes are copied into."""
SMALL_PAGE_BYTES = 64 * 1024
"""Smallest page (a small object does not allocate a whole ``PAGE_BYTES`` page)."""
KEEP_BYTES_MIN = 64 * 1024
"""A whole ``bytes`` write at least this large is kept by reference instead of copied."""
assert SMALL_PAGE_BYTES <= PAGE_BYTES <= MIN_PART_SIZE_BYTES


@dataclass(frozen=True, slots=True)
class UploadShape:
    """How one upload buffers: what :func:`upload_shape` picked."""

    part_size_bytes: int
    part_concurrency_max: int
    """Parts sent in the background at once; 0: each part is sent inline (``write`` waits)."""
    staged_max_bytes: int
    """Largest object kept staged for a single PUT."""

    @property
    def held_max_bytes(self) -> int:
        """Most written bytes the upload holds: the parts in flight plus the part being filled (the
        part waiting for a slot, when all are busy); inline, the one part being sent."""
        return (self.part_concurrency_max + 1) * self.part_size_bytes


def upload_shape(
    *,
    part_size_bytes: int,
    part_concurrency_max: int,
    multipart_threshold_bytes: int,
    buffer_max_bytes: int | None = None,
) -> UploadShape:
    """Part size, parts in flight and staging limit of one upload (pure; see the module docstring).

    Without ``buffer_max_bytes`` the configured values hold. With it, the configured part size is
    kept while at least two parts fit (one in flight, one being filled) and the parts in flight
    shrink to fit; below that, parts of ``buffer_max_bytes // 2`` (at least ``MIN_PART_SIZE_BYTES``)
    with one in flight; below two minimum parts, one part sent inline.
    """
    check_buffer_max_bytes(buffer_max_bytes)
    part, inflight = part_size_bytes, part_concurrency_max
    if buffer_max_bytes is not None and (inflight + 1) * part > buffer_max_bytes:
        if buffer_max_bytes >= 2 * part:
            inflight = buffer_max_bytes // part - 1
        elif buffer_max_bytes >= 2 * MIN_PART_SIZE_BYTES:
            part, inflight = buffer_max_bytes // 2, 1
        else:
            part, inflight = max(MIN_PART_SIZE_BYTES, min(part, buffer_max_bytes)), 0
    staged_max = min(multipart_threshold_bytes, max(1, inflight) * part)
    shape = UploadShape(part, inflight, staged_max)
    assert MIN_PART_SIZE_BYTES <= shape.part_size_bytes <= part_size_bytes
    assert shape.staged_max_bytes <= shape.held_max_bytes
    assert buffer_max_bytes is None or shape.held_max_bytes <= max(buffer_max_bytes, MIN_PART_SIZE_BYTES)
    return shape


class UploadTarget(Protocol):
    """What an upload needs of its storage: the retried calls of an :class:`S3Client` and three object
    operations. :class:`~s3stream.storage.s3.S3ObjectStorage` is one (this module does not import it)."""

    @property
    def config(self) -> S3Config: ...

    @property
    def stats(self) -> StorageStats: ...

    async def call(
        self, op: str, what: str, attempt: Callable[[Any], Awaitable[T]], *, size_bytes: int = 0
    ) -> T: ...

    def full_key(self, key: str) -> str: ...

    async def body_digests(self, pieces: Sequence[Piece], size_bytes: int) -> BodyDigests | None: ...

    async def head(self, key: str) -> ObjectInfo: ...

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes: ...

    async def put_pieces(
        self, full: str, key: str, pieces: Sequence[Piece], *, if_absent: bool = False
    ) -> None: ...


def _size_of(pieces: Sequence[Piece]) -> int:
    return sum(end - start for _, start, end in pieces)


class S3Upload:
    """See the module docstring. Created by :meth:`S3ObjectStorage.upload`."""

    def __init__(
        self,
        storage: UploadTarget,
        key: str,
        full_key: str,
        *,
        buffer_max_bytes: int | None = None,
        if_absent: bool = False,
    ) -> None:
        self.key = key
        self._storage = storage
        self._if_absent = if_absent
        """Create-only: the PUT or CompleteMultipartUpload carries ``If-None-Match: *``."""
        self._config = storage.config
        self._full_key = full_key
        self.shape = upload_shape(
            part_size_bytes=self._config.part_size_bytes,
            part_concurrency_max=self._config.part_concurrency_max,
            multipart_threshold_bytes=self._config.multipart_threshold_bytes,
            buffer_max_bytes=buffer_max_bytes,
        )
        self._part_size = self.shape.part_size_bytes
        self._staged_max_bytes = self.shape.staged_max_bytes
        self._size_bytes = 0
        self._done = False
        self._source_sizes: dict[str, int] = {}
        # written bytes not yet sent (staged: the whole object so far; multipart: the current part)
        self._pieces: list[Piece] = []
        self._pieces_bytes = 0
        self._page: bytearray | None = None  # page being filled; its filled part ends the pieces
        self._page_fill = 0
        # staged mode: copies to range-read at complete, as (index in self._pieces, key, start, end)
        self._staged = True
        self._staged_copies: list[tuple[int, str, int, int]] = []
        # multipart mode
        self._upload_id: str | None = None
        self._next_part = 1
        self._etags: dict[int, str] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._slots = asyncio.Semaphore(max(1, self.shape.part_concurrency_max))
        self._failure: BaseException | None = None

    # -- public ------------------------------------------------------------------------------

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        self._check_active()
        view = memoryview(data)
        if not view.contiguous:
            raise InvalidArgumentError(f"write to {self.key!r}: the buffer is not contiguous")
        view = view.cast("B") if view.format != "B" or view.ndim != 1 else view
        if view.nbytes == 0:
            return
        await self._guard(self._write(data, view))

    async def copy(self, source_key: str, start: int, end: int) -> None:
        self._check_active()
        await self._guard(self._copy(source_key, start, end))

    async def complete(self) -> int:
        self._check_active()
        await self._guard(self._complete())
        self._done = True
        return self._size_bytes

    async def abort(self) -> None:
        if self._done:
            return
        self._done = True
        self._drop_buffers()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._upload_id is None:
            return
        upload_id, self._upload_id = self._upload_id, None

        async def attempt(client: Any) -> None:
            await client.abort_multipart_upload(
                Bucket=self._config.bucket, Key=self._full_key, UploadId=upload_id
            )

        try:
            await self._storage.call("AbortMultipartUpload", repr(self.key), attempt)
            self._storage.stats.record("abort_multipart")
        except NotFoundError:
            pass
        except S3StreamError as exc:  # the parts stay invisible; a bucket lifecycle rule reaps them
            log_event(log, logging.WARNING, "s3.abort_failed", upload_id=upload_id, key=self.key, error=exc)

    # -- steps -------------------------------------------------------------------------------

    def _check_active(self) -> None:
        if self._done:
            raise ClosedError(f"upload of {self.key!r} already completed or aborted")
        if self._failure is not None:
            raise self._failure

    async def _guard(self, step: Any) -> None:
        """Await one step; any failure (or cancellation) aborts the upload, then propagates."""
        try:
            await step
            if self._failure is not None:
                raise self._failure
        except BaseException:
            await self.abort()
            raise

    def _drop_buffers(self) -> None:
        self._pieces, self._pieces_bytes, self._page, self._page_fill = [], 0, None, 0
        self._staged_copies = []

    async def _write(self, data: bytes | bytearray | memoryview, view: memoryview) -> None:
        if self._staged and self._size_bytes + view.nbytes > self._staged_max_bytes:
            await self._go_multipart()
        self._size_bytes += view.nbytes
        if isinstance(data, bytes) and view.nbytes >= KEEP_BYTES_MIN:
            await self._add_bytes(data)
        else:
            await self._add_copy_of(view)

    async def _copy(self, source_key: str, start: int, end: int) -> None:
        validate_key(source_key)
        validate_range(source_key, start, end)
        if source_key not in self._source_sizes:
            self._source_sizes[source_key] = (await self._storage.head(source_key)).size_bytes
        resolve_range(source_key, start, end, self._source_sizes[source_key])
        if start == end:
            return
        if self._staged and self._size_bytes + end - start > self._staged_max_bytes:
            await self._go_multipart()
        self._size_bytes += end - start
        self._storage.stats.record("copy", end - start)
        if self._staged:
            self._seal_page()
            self._staged_copies.append((len(self._pieces), source_key, start, end))
            self._pieces.append((b"", 0, 0))  # filled by _read_staged_copies
        else:
            await self._multipart_copy(source_key, start, end)

    # -- buffering ---------------------------------------------------------------------------

    def _seal_page(self) -> None:
        """Close the page being filled: its unused tail is never written again, so it is freed
        (unless a body being sent still views the page: then it goes with that part)."""
        page, fill = self._page, self._page_fill
        self._page, self._page_fill = None, 0
        if page is not None and fill < len(page):
            with contextlib.suppress(BufferError):
                del page[fill:]

    async def _add_bytes(self, data: bytes) -> None:
        """Keep a whole immutable ``bytes`` by reference (multipart: cut at part boundaries)."""
        self._seal_page()
        await self._add_piece((data, 0, len(data)))

    async def _add_copy_of(self, view: memoryview) -> None:
        """Copy ``view`` into owned pages; in multipart mode a page never crosses a part boundary.
        A large write lets the event loop run between pages (a page is ~0.1-0.4 ms of copying)."""
        while view.nbytes:
            if self._page is None or self._page_fill == len(self._page):
                room = PAGE_BYTES
                if not self._staged:
                    room = min(room, self._part_size - self._pieces_bytes)
                self._page = bytearray(min(room, max(SMALL_PAGE_BYTES, self._size_bytes)))
                self._page_fill = 0
            page, at = self._page, self._page_fill
            n = min(len(page) - at, view.nbytes)
            page[at : at + n] = view[:n]
            view = view[n:]
            self._page_fill = at + n
            last = self._pieces[-1] if self._pieces else None
            if last is not None and last[0] is page and last[2] == at:
                self._pieces[-1] = (page, last[1], at + n)
                self._pieces_bytes += n
                if not self._staged and self._pieces_bytes >= self._part_size:
                    await self._send_part()
            else:
                await self._add_piece((page, at, at + n))
            if view.nbytes:
                await asyncio.sleep(0)

    async def _add_piece(self, piece: Piece) -> None:
        buffer, start, end = piece
        while start < end:
            n = end - start
            if not self._staged:
                n = min(n, self._part_size - self._pieces_bytes)
            self._pieces.append((buffer, start, start + n))
            self._pieces_bytes += n
            start += n
            if not self._staged and self._pieces_bytes >= self._part_size:
                await self._send_part()

    # -- multipart ---------------------------------------------------------------------------

    async def _go_multipart(self) -> None:
        """Start the multipart upload; the staged data so far becomes its first part(s)."""
        staged, self._pieces, self._pieces_bytes = self._pieces, [], 0
        copies = {index: (key, start, end) for index, key, start, end in self._staged_copies}
        self._staged_copies = []
        self._staged = False
        self._seal_page()

        async def attempt(client: Any) -> str:
            response = await client.create_multipart_upload(Bucket=self._config.bucket, Key=self._full_key)
            return str(response["UploadId"])

        self._upload_id = await self._storage.call("CreateMultipartUpload", repr(self.key), attempt)
        self._storage.stats.record("create_multipart")
        for index, piece in enumerate(staged):
            if index in copies:
                await self._multipart_copy(*copies[index])
            else:
                await self._add_piece(piece)

    async def _read(self, source_key: str, start: int, end: int) -> bytes:
        return await self._storage.get(source_key, start, end)

    async def _read_into_buffer(self, source_key: str, start: int, end: int) -> None:
        data = await self._read(source_key, start, end)
        self._seal_page()
        await self._add_piece((data, 0, len(data)))

    async def _send_part(self) -> None:
        if not self._pieces_bytes:
            return
        pieces, self._pieces, self._pieces_bytes = self._pieces, [], 0
        self._seal_page()
        await self._start_part(lambda number: self._upload_part(number, pieces))

    async def _multipart_copy(self, source_key: str, start: int, end: int) -> None:
        for chunk_start in range(start, end, MAX_PART_SIZE_BYTES):
            chunk_end = min(end, chunk_start + MAX_PART_SIZE_BYTES)
            size = chunk_end - chunk_start
            if self._pieces_bytes == 0:
                if size < MIN_PART_SIZE_BYTES:
                    await self._read_into_buffer(source_key, chunk_start, chunk_end)
                else:
                    await self._start_copy_part(source_key, chunk_start, chunk_end)
            elif self._pieces_bytes + size > self._part_size:
                top_up = max(0, MIN_PART_SIZE_BYTES - self._pieces_bytes)
                if top_up:
                    await self._read_into_buffer(source_key, chunk_start, chunk_start + top_up)
                await self._send_part()
                rest_start = chunk_start + top_up
                if chunk_end - rest_start >= MIN_PART_SIZE_BYTES:
                    await self._start_copy_part(source_key, rest_start, chunk_end)
                elif rest_start < chunk_end:
                    await self._read_into_buffer(source_key, rest_start, chunk_end)
            else:
                await self._read_into_buffer(source_key, chunk_start, chunk_end)

    async def _start_copy_part(self, source_key: str, start: int, end: int) -> None:
        source = {"Bucket": self._config.bucket, "Key": self._storage.full_key(source_key)}
        await self._start_part(lambda number: self._upload_part_copy(number, source, start, end))

    async def _start_part(self, send: Any) -> None:
        """Reserve the next part number and a concurrency slot, then send the part in the background."""
        number = self._next_part
        if number > MAX_PART_COUNT:
            raise InvalidArgumentError(f"upload of {self.key!r} needs more than {MAX_PART_COUNT} parts")
        self._next_part += 1
        await self._slots.acquire()

        async def run() -> None:
            try:
                await send(number)
            except Exception as exc:  # noqa: BLE001 - task boundary: kept for the next step, which aborts
                if self._failure is None:
                    self._failure = exc
            finally:
                self._slots.release()

        if self.shape.part_concurrency_max == 0:  # inline: the part's bytes go before the next write
            await run()
            if self._failure is not None:
                raise self._failure
            return
        task = asyncio.create_task(run(), name=f"s3-part-{self.key}-{number}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _upload_part(self, number: int, pieces: list[Piece]) -> None:
        upload_id = self._upload_id
        size = _size_of(pieces)
        digests = await self._storage.body_digests(pieces, size)

        async def attempt(client: Any) -> str:
            response = await client.upload_part(
                Bucket=self._config.bucket,
                Key=self._full_key,
                UploadId=upload_id,
                PartNumber=number,
                Body=PiecesReader(pieces, sha256_hex=digests.sha256_hex if digests else None),
                **digest_params(digests),
            )
            return str(response["ETag"])

        self._etags[number] = await self._storage.call(
            "UploadPart", f"{self.key!r} #{number}", attempt, size_bytes=size
        )
        self._storage.stats.record("upload_part", size)

    async def _upload_part_copy(self, number: int, source: dict[str, str], start: int, end: int) -> None:
        upload_id = self._upload_id

        async def attempt(client: Any) -> str:
            response = await client.upload_part_copy(
                Bucket=self._config.bucket,
                Key=self._full_key,
                UploadId=upload_id,
                PartNumber=number,
                CopySource=source,
                CopySourceRange=f"bytes={start}-{end - 1}",
            )
            return str(response["CopyPartResult"]["ETag"])

        self._etags[number] = await self._storage.call(
            "UploadPartCopy", f"{self.key!r} #{number}", attempt, size_bytes=end - start
        )
        self._storage.stats.record("upload_part_copy", end - start)

    # -- complete ----------------------------------------------------------------------------

    async def _complete(self) -> None:
        if self._staged:
            self._seal_page()
            await self._read_staged_copies()
            await self._storage.put_pieces(self._full_key, self.key, self._pieces, if_absent=self._if_absent)
            self._drop_buffers()
            return
        await self._send_part()
        await asyncio.gather(*list(self._tasks))
        if self._failure is not None:
            raise self._failure
        parts = [{"PartNumber": n, "ETag": self._etags[n]} for n in sorted(self._etags)]
        assert [p["PartNumber"] for p in parts] == list(range(1, self._next_part))
        upload_id = self._upload_id
        attempts = 0
        extra = {"IfNoneMatch": "*"} if self._if_absent else {}
        if self._if_absent:
            # Ceph RGW (16.2 here) ignores If-None-Match on CompleteMultipartUpload and replaces
            # the object: a HEAD first refuses an existing key there. Only two completes of one key
            # racing between the HEAD and the complete both publish (where the header is ignored).
            try:
                await self._storage.head(self.key)
            except NotFoundError:
                pass
            else:
                raise ConflictError(f"create-only upload of {self.key!r}: the object exists")

        async def attempt(client: Any) -> None:
            nonlocal attempts
            attempts += 1
            await client.complete_multipart_upload(
                Bucket=self._config.bucket,
                Key=self._full_key,
                UploadId=upload_id,
                MultipartUpload={"Parts": parts},
                **extra,
            )

        try:
            await self._storage.call("CompleteMultipartUpload", repr(self.key), attempt)
        except (NotFoundError, ConflictError):
            # NoSuchUpload (or, create-only, the object exists) on a retry: the first attempt may
            # have completed with its answer lost.
            if attempts < 2 or (await self._storage.head(self.key)).size_bytes != self._size_bytes:
                raise
        self._upload_id = None  # completed: nothing left to abort
        self._storage.stats.record("complete_multipart")

    async def _read_staged_copies(self) -> None:
        """Range-read the staged copies (concurrently, at most ``part_concurrency_max`` at once)."""
        copies, self._staged_copies = self._staged_copies, []
        slots = asyncio.Semaphore(max(1, self.shape.part_concurrency_max))

        async def read(index: int, source_key: str, start: int, end: int) -> None:
            async with slots:
                data = await self._read(source_key, start, end)
            self._pieces[index] = (data, 0, len(data))
            self._pieces_bytes += len(data)

        reads = [asyncio.ensure_future(read(*copy)) for copy in copies]
        try:
            await asyncio.gather(*reads)
        except BaseException:
            for future in reads:
                future.cancel()
            await asyncio.gather(*reads, return_exceptions=True)
            raise
