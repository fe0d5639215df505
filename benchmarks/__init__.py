"""Benchmarks: python -m benchmarks <workload> [--quick] [--json FILE]."""
