"""Benchmarks of the proxy: overhead, assembly cost, long-run savings, estimator accuracy (``python -m bench``)."""
