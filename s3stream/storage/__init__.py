"""Storage backends: the ObjectStorage protocol and its local, S3 and in-memory implementations.

``base`` (protocol), ``keys`` (the key rules every backend shares), ``memory`` (the in-memory twin),
``local`` (``file:///path``, the embedded default), ``s3`` + ``s3upload`` + ``retry`` (S3 through
aiobotocore), ``uri`` (AutoMQ-style bucket URIs and :func:`~s3stream.storage.uri.open_storage`),
``stats`` (request counters). Import the backend modules directly; this package imports nothing, so
using the memory or local store never loads aiobotocore.
"""
