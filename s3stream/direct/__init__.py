"""Direct writes: objects written outside an engine (Spark executors), committed by the node that owns the streams."""
