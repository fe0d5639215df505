"""Several buckets behind one ObjectStorage: placement strategies, bucket health, the placement log.

See docs/architecture.md, "Multiple buckets". :class:`~s3stream.buckets.storage.MultiBucketStorage`
is the entry point; :func:`~s3stream.buckets.spec.parse_bucket_list` reads ``s3.data.buckets``.
"""
