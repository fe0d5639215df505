"""Benchmark workloads: one module per workload, each with ``async def run(ctx) -> list[Result]``."""
