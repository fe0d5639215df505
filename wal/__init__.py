"""Block WAL: a durable, group-committed, circular log on a file or raw block device. Imports nothing of s3stream."""
