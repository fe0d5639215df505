"""The payloads of one micro-batch on the driver: deterministic order and writable views.

Built from the Arrow table the executors return (:data:`spark_sink.encode.OUTPUT_SCHEMA`): inline
payloads are copied once into a bytearray; spilled payloads are mapped copy-on-write from the
executors' files. Either way the sink can patch each Kafka batch's base offset in place.
"""

from __future__ import annotations

import mmap

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from s3stream.errors import CorruptionError, UnavailableError
from spark_sink.protocol import PayloadRef


class PayloadTable:
    """The collected payloads: ordered refs and writable views (for the base offset patch).

    Inline payloads are copied once into a bytearray; spilled payloads are mapped copy-on-write
    (``ACCESS_COPY``) from the executors' files, so only the pages whose base offset is patched are
    copied before the engine's own copy.
    """

    def __init__(self, table: pa.Table) -> None:
        order = pc.sort_indices(
            table.select(["task_partition", "partition", "seq"]),
            sort_keys=[("task_partition", "ascending"), ("partition", "ascending"), ("seq", "ascending")],
        ).to_numpy()
        self._order = order
        self._table = table
        self._views: list[memoryview] = []
        self._maps: dict[str, tuple[mmap.mmap, memoryview]] = {}
        payload = table.column("payload")
        for arr in payload.chunks:
            if len(arr) == 0:
                continue
            buffers = arr.buffers()
            offsets = np.frombuffer(buffers[1], dtype=np.int32)[arr.offset : arr.offset + len(arr) + 1]
            data = memoryview(bytearray(buffers[2])) if buffers[2] is not None else memoryview(bytearray())
            for i in range(len(arr)):
                self._views.append(data[int(offsets[i]) : int(offsets[i + 1])])
        files = table.column("spill_file").to_pylist()
        spill_offsets = table.column("spill_offset").to_pylist()
        sizes = table.column("size_bytes").to_pylist()
        for i, path in enumerate(files):
            if path is not None:
                self._views[i] = self._map(path, spill_offsets[i], sizes[i])

    def _map(self, path: str, offset: int, size: int) -> memoryview:
        if path not in self._maps:
            try:
                with open(path, "rb") as f:
                    mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
            except (OSError, ValueError) as exc:
                raise UnavailableError(
                    f"cannot map the executor's spill file {path} ({exc}); outside local mode use spill=False"
                ) from exc
            self._maps[path] = (mm, memoryview(mm))
        mm, view = self._maps[path]
        if offset + size > len(mm):
            raise CorruptionError(
                f"spill file is {len(mm)} bytes, payload ends at {offset + size}", source=path
            )
        return view[offset : offset + size]

    def refs(self) -> list[PayloadRef]:
        t = self._table
        part = t.column("partition").to_pylist()
        counts = t.column("record_count").to_pylist()
        crcs = t.column("content_crc").to_pylist()
        return [
            PayloadRef(int(i), part[i], counts[i], crcs[i], len(self._views[i])) for i in self._order.tolist()
        ]

    def view(self, index: int) -> memoryview:
        return self._views[index]

    def close(self) -> None:
        """Release the views and unmap the spill files."""
        for v in self._views:
            v.release()
        self._views.clear()
        for mm, view in self._maps.values():
            view.release()
            mm.close()
        self._maps.clear()
