"""Benchmarks (``inferscale-memory bench ...``): scripts with reports, never unit tests."""
