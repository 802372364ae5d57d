"""Benchmarks (`make bench`): load over real HTTPS, scale of the caches. Not tests: numbers, not verdicts."""
