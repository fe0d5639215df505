"""Metadata stores: streams, epochs, objects and their lifecycle, KV pairs (AutoMQ's controller).

- ``base``: the MetadataStore protocol and its value types;
- ``controller``, ``stream_ops``, ``object_ops``, ``queries``: the operations, written once as pure
  decisions (preconditions in AutoMQ's order -> ``changes``), shared by every store;
- ``sqlite`` (+ ``sqlite_schema``): the durable store, schema in docs/format.md section 6; the
  statements both SQL stores run: ``sql_view`` (reads) and ``sql_apply`` (changes);
- ``postgres`` (+ ``postgres_schema``, ``postgres_clock``): the shared store on PostgreSQL, running
  SQLite's schema and statements; ``url``: which store ``s3.metadata.url`` names;
- ``memory``: the in-memory twin; ``store``: the async methods over a backend's transact/query.
"""
