"""A fuzzer for traceanalyzer's inputs and output directory (stdlib and the project only).

``python -m tests.fuzz --cases 5000`` runs the long campaign; ``tests/test_fuzz.py`` runs a
fixed-seed sample in CI. What is tried and what is guaranteed: docs/reliability.md.
"""
