"""Benchmark scripts (run as `python benchmarks/NAME.py`), each named in the section of
benchmarks/RESULTS.md whose table it produces, and what they share (common.py)."""
