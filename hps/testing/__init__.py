"""Helpers that start real servers for the tests and the benchmarks (never used in serving)."""
