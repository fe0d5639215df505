"""Spark Structured Streaming sink (foreachBatch) into s3stream, exactly once."""
