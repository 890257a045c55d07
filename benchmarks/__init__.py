"""Benchmarks of minimind_ref (``make bench``). Results: ``benchmarks/results/``."""
