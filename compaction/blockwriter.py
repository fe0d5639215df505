"""BlockCopyWriter: a new object made of verified data blocks copied verbatim, then its rebuilt tail.

Compaction already holds each block's bytes (a view of a GET buffer, verified against its CRC32C)
and its CRC, so this writer hands every block straight to ``Upload.write`` (the upload takes its
own copy) instead of buffering it a second time, re-bases the index positions, and ends the object
with the index block, the checksum section (the blocks' CRCs) and the footer (``docs/format.md``
section 2, via ``encode_tail``). Blocks must arrive in (stream id, offset) order.
"""

from __future__ import annotations

from crc32c import crc32c

from s3stream.errors import ClosedError, CorruptionError, InvalidArgumentError
from s3stream.objectformat import IndexEntry, WrittenObject, encode_tail, stream_ranges_of
from s3stream.storage.base import Upload


class BlockCopyWriter:
    """Writes one object from whole blocks. Calls must not overlap; ``abort`` after any failure."""

    def __init__(self, upload: Upload) -> None:
        """Every backend's upload copies a block it is handed as a view (keeping only whole ``bytes``),
        so a block's GET buffer is free once the step drops it, even for an object written across steps."""
        self._upload = upload
        self._entries: list[IndexEntry] = []
        self._crcs: list[int] = []
        self._position = 0
        self._closed = False

    @property
    def key(self) -> str:
        return self._upload.key

    async def write_block(self, entry: IndexEntry, block: memoryview | bytes, crc: int | None = None) -> None:
        """Append one verified block; ``crc`` is its CRC32C when known (computed otherwise)."""
        if self._closed:
            raise ClosedError(f"block writer for {self.key} is closed")
        if len(block) != entry.size_bytes:
            raise InvalidArgumentError(
                f"block of {len(block)} bytes for an entry of {entry.size_bytes} bytes"
            )
        if self._entries:
            last = self._entries[-1]
            if (entry.stream_id, entry.start_offset) < (last.stream_id, last.end_offset):
                raise InvalidArgumentError(
                    f"block of stream {entry.stream_id} at offset {entry.start_offset} is out of order after "
                    f"stream {last.stream_id} end offset {last.end_offset}"
                )
        self._entries.append(
            IndexEntry(
                entry.stream_id,
                entry.start_offset,
                entry.end_offset,
                entry.record_count,
                self._position,
                entry.size_bytes,
            )
        )
        self._crcs.append(crc if crc is not None else crc32c(block))
        self._position += entry.size_bytes
        try:
            await self._upload.write(block)
        except BaseException:
            self._closed = True
            raise

    async def close(self) -> WrittenObject:
        """Write the tail and publish the object."""
        if self._closed:
            raise ClosedError(f"block writer for {self.key} is closed")
        self._closed = True
        tail = encode_tail(self._entries, self._crcs, index_position=self._position)
        await self._upload.write(tail)
        size_bytes = await self._upload.complete()
        expected = self._position + len(tail)
        if size_bytes != expected:
            raise CorruptionError(
                f"storage reports {size_bytes} bytes for an object of {expected} bytes", source=self.key
            )
        index = tuple(self._entries)
        return WrittenObject(self.key, size_bytes, index, stream_ranges_of(index))

    async def abort(self) -> None:
        self._closed = True
        await self._upload.abort()
