"""The engine: streams, LogCache, uploads, read path, recovery."""
