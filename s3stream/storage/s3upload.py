"""S3Upload: one object written in pieces to S3, as one PUT or as a multipart upload.

The writer follows AutoMQ's ProxyWriter / MultiPartWriter (reference section 6.3):

* **Staged** while the total stays <= ``multipart_threshold_bytes``: writes are kept (immutable
  ``bytes`` by reference, anything mutable copied once) and copies are kept as ranges; ``complete``
  range-reads the copies and issues a single PutObject.
* **Multipart** once the total passes the threshold: the staged operations are replayed in order.
  Writes fill the current part; a part is sent once it reaches ``part_size_bytes`` (big writes are
  cut into exact part-size pieces). A copy ``[start, end)`` (split into <= 5 GiB chunks) becomes:
  with no buffered part, an UploadPartCopy if the chunk is >= 5 MiB, else a range read into the
  buffer; with a buffered part that the chunk would push past ``part_size_bytes``, a range read that
  tops the buffer up to 5 MiB, the part sent, and the rest as UploadPartCopy (or read, if < 5 MiB);
  otherwise a range read into the buffer.

Parts go out concurrently, at most ``part_concurrency_max`` per upload (``write`` waits for a slot,
so buffered memory is bounded). Any failure of a part, a copy or ``complete`` aborts the upload
(AbortMultipartUpload) before the error is raised: nothing of the object ever becomes visible. The
object's size is our own tally; the ETag of CompleteMultipartUpload is never read.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from s3stream.errors import ClosedError, InvalidArgumentError, NotFoundError, S3StreamError
from s3stream.storage.base import MAX_PART_COUNT, MAX_PART_SIZE_BYTES, MIN_PART_SIZE_BYTES
from s3stream.storage.keys import resolve_range, validate_key, validate_range

if TYPE_CHECKING:
    from s3stream.storage.s3 import S3ObjectStorage

log = logging.getLogger(__name__)

_Chunk = bytes | memoryview
"""Immutable bytes (or a view of immutable bytes) owned by the upload."""


def _join(pieces: list[_Chunk]) -> bytes:
    """One ``bytes`` body; no copy when it is a single whole ``bytes`` object already."""
    if len(pieces) == 1:
        only = pieces[0]
        if isinstance(only, bytes):
            return only
        if isinstance(only.obj, bytes) and only.nbytes == len(only.obj):
            return only.obj
    return b"".join(pieces)


def _owned(data: bytes | bytearray | memoryview) -> _Chunk:
    """The data as something the caller cannot change under us (copying only mutable buffers)."""
    if isinstance(data, bytes):
        return data
    if isinstance(data, memoryview) and isinstance(data.obj, bytes) and data.contiguous:
        return data.cast("B") if data.format != "B" or data.ndim != 1 else data
    return bytes(data)


class S3Upload:
    """See the module docstring. Created by :meth:`S3ObjectStorage.upload`."""

    def __init__(self, storage: S3ObjectStorage, key: str, full_key: str) -> None:
        self.key = key
        self._storage = storage
        self._config = storage.config
        self._full_key = full_key
        self._part_size = self._config.part_size_bytes
        self._size_bytes = 0
        self._done = False
        self._source_sizes: dict[str, int] = {}
        # staged mode
        self._staged: list[_Chunk | tuple[str, int, int]] | None = []
        # multipart mode
        self._upload_id: str | None = None
        self._buffer: list[_Chunk] = []
        self._buffer_bytes = 0
        self._next_part = 1
        self._etags: dict[int, str] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._slots = asyncio.Semaphore(self._config.part_concurrency_max)
        self._failure: BaseException | None = None

    # -- public ------------------------------------------------------------------------------

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        self._check_active()
        chunk = _owned(data)
        size = len(chunk) if isinstance(chunk, bytes) else chunk.nbytes
        if size == 0:
            return
        await self._guard(self._write(chunk, size))

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
        self._staged = None
        self._buffer = []
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
            log.warning("abort of multipart upload %s for %r failed: %s", upload_id, self.key, exc)

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

    async def _write(self, chunk: _Chunk, size: int) -> None:
        self._size_bytes += size
        if self._staged is not None:
            self._staged.append(chunk)
            await self._maybe_go_multipart()
        else:
            await self._buffer_write(chunk)

    async def _copy(self, source_key: str, start: int, end: int) -> None:
        validate_key(source_key)
        validate_range(source_key, start, end)
        if source_key not in self._source_sizes:
            self._source_sizes[source_key] = (await self._storage.head(source_key)).size_bytes
        resolve_range(source_key, start, end, self._source_sizes[source_key])
        if start == end:
            return
        self._size_bytes += end - start
        self._storage.stats.record("copy", end - start)
        if self._staged is not None:
            self._staged.append((source_key, start, end))
            await self._maybe_go_multipart()
        else:
            await self._multipart_copy(source_key, start, end)

    async def _maybe_go_multipart(self) -> None:
        if self._size_bytes <= self._config.multipart_threshold_bytes:
            return
        staged, self._staged = self._staged or [], None

        async def attempt(client: Any) -> str:
            response = await client.create_multipart_upload(Bucket=self._config.bucket, Key=self._full_key)
            return str(response["UploadId"])

        self._upload_id = await self._storage.call("CreateMultipartUpload", repr(self.key), attempt)
        self._storage.stats.record("create_multipart")
        for op in staged:
            if isinstance(op, tuple):
                await self._multipart_copy(*op)
            else:
                await self._buffer_write(op)

    async def _read(self, source_key: str, start: int, end: int) -> bytes:
        return await self._storage.get(source_key, start, end)

    async def _buffer_write(self, chunk: _Chunk) -> None:
        view = memoryview(chunk)
        while view.nbytes:
            room = self._part_size - self._buffer_bytes
            piece, view = view[:room], view[room:]
            self._buffer.append(piece)
            self._buffer_bytes += piece.nbytes
            if self._buffer_bytes >= self._part_size:
                await self._send_buffer()

    async def _send_buffer(self) -> None:
        if not self._buffer_bytes:
            return
        pieces, self._buffer, self._buffer_bytes = self._buffer, [], 0
        body = _join(pieces)
        await self._start_part(lambda number: self._upload_part(number, body))

    async def _multipart_copy(self, source_key: str, start: int, end: int) -> None:
        for chunk_start in range(start, end, MAX_PART_SIZE_BYTES):
            chunk_end = min(end, chunk_start + MAX_PART_SIZE_BYTES)
            size = chunk_end - chunk_start
            if self._buffer_bytes == 0:
                if size < MIN_PART_SIZE_BYTES:
                    await self._buffer_write(await self._read(source_key, chunk_start, chunk_end))
                else:
                    await self._start_copy_part(source_key, chunk_start, chunk_end)
            elif self._buffer_bytes + size > self._part_size:
                top_up = max(0, MIN_PART_SIZE_BYTES - self._buffer_bytes)
                if top_up:
                    await self._buffer_write(await self._read(source_key, chunk_start, chunk_start + top_up))
                await self._send_buffer()
                rest_start = chunk_start + top_up
                if chunk_end - rest_start >= MIN_PART_SIZE_BYTES:
                    await self._start_copy_part(source_key, rest_start, chunk_end)
                elif rest_start < chunk_end:
                    await self._buffer_write(await self._read(source_key, rest_start, chunk_end))
            else:
                await self._buffer_write(await self._read(source_key, chunk_start, chunk_end))

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

        task = asyncio.create_task(run(), name=f"s3-part-{self.key}-{number}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _upload_part(self, number: int, body: bytes) -> None:
        upload_id = self._upload_id

        async def attempt(client: Any) -> str:
            response = await client.upload_part(
                Bucket=self._config.bucket,
                Key=self._full_key,
                UploadId=upload_id,
                PartNumber=number,
                Body=body,
            )
            return str(response["ETag"])

        self._etags[number] = await self._storage.call(
            "UploadPart", f"{self.key!r} #{number}", attempt, size_bytes=len(body)
        )
        self._storage.stats.record("upload_part", len(body))

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

    async def _complete(self) -> None:
        if self._staged is not None:
            await self._complete_single_put(self._staged)
            return
        await self._send_buffer()
        await asyncio.gather(*list(self._tasks))
        if self._failure is not None:
            raise self._failure
        parts = [{"PartNumber": n, "ETag": self._etags[n]} for n in sorted(self._etags)]
        assert [p["PartNumber"] for p in parts] == list(range(1, self._next_part))
        upload_id = self._upload_id
        attempts = 0

        async def attempt(client: Any) -> None:
            nonlocal attempts
            attempts += 1
            await client.complete_multipart_upload(
                Bucket=self._config.bucket,
                Key=self._full_key,
                UploadId=upload_id,
                MultipartUpload={"Parts": parts},
            )

        try:
            await self._storage.call("CompleteMultipartUpload", repr(self.key), attempt)
        except NotFoundError:
            # NoSuchUpload on a retry: the first attempt may have completed with its answer lost.
            if attempts < 2 or (await self._storage.head(self.key)).size_bytes != self._size_bytes:
                raise
        self._upload_id = None  # completed: nothing left to abort
        self._storage.stats.record("complete_multipart")

    async def _complete_single_put(self, staged: list[_Chunk | tuple[str, int, int]]) -> None:
        reads = {
            index: asyncio.ensure_future(self._read(*op))
            for index, op in enumerate(staged)
            if isinstance(op, tuple)
        }
        try:
            await asyncio.gather(*reads.values())
        except BaseException:
            for future in reads.values():
                future.cancel()
            raise
        pieces = [reads[i].result() if isinstance(op, tuple) else op for i, op in enumerate(staged)]
        body = _join(pieces)
        await self._storage.put_body(self._full_key, self.key, body, if_absent=False)
        self._staged = None
