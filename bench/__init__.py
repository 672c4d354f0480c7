"""Benchmarks: each compares hybridflow against a baseline measured in the same run."""
