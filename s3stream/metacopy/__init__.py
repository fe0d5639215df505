"""The metadata copy in the bucket: a SQLite data dir's metadata, kept restorable from its object storage.

:mod:`~s3stream.metacopy.objects` names and frames the copy's objects, :mod:`~s3stream.metacopy.replicator`
keeps them current, :mod:`~s3stream.metacopy.restore` rebuilds a metadata database from them
(``docs/architecture.md``, "The metadata copy in the bucket"; ``docs/format.md`` section 6.1).
"""
