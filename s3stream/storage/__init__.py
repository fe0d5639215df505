"""Storage backends: the ObjectStorage protocol and its local, S3 and in-memory implementations."""
