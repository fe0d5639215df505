"""The engine: streams, LogCache, uploads, read path, recovery. Which module owns what:

- ``client``: the public async API (Client, StreamClient, Stream, KVClient).
- ``core``: the engine of one node: stream lifecycle, fetch, restart recovery, wiring of its parts;
  ``stream`` (one open stream's state), ``supervisor`` (background tasks, failure state).
- Write path: ``append`` (admission, one WAL record per append, in-order acknowledgement),
  ``sequencer`` (per-stream release in offset order), ``walbody`` (the WAL record body codec),
  ``walport`` (the WAL the engine needs, and its in-memory twin), ``logcache`` (acknowledged batches in
  memory), ``waltrim`` (which WAL records may be trimmed), ``kvlog`` (KV changes in WAL order).
- Upload: ``pipeline`` (LogCache block -> prepare -> upload -> commit -> WAL trim), ``upload`` (one
  block into objects).
- Read path: ``reader`` (stream ranges from objects, readahead), ``readstate`` (per-consumer reader
  state), ``blockcache`` (decoded data blocks), ``fetchmerge`` (objects head + LogCache tail).
- Recovery: ``recovery`` (what to replay from the WAL after a restart).

The adapter of the block WAL (``s3stream.walblock``) and the wiring of all parts (``s3stream.assembly``)
live above the engine; nothing here imports them.
"""
