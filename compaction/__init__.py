"""Compaction: pure planners and I/O executors for StreamSet and stream objects; deletion and GC."""
