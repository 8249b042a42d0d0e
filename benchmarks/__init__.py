"""GPU benchmark scripts (run as `python benchmarks/NAME.py`); figures go to RESULTS.md."""
