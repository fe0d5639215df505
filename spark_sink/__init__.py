"""Spark Structured Streaming into s3stream: a foreachBatch sink, a reader, the Kafka payload codec."""
