"""Benchmarks (``tvm-pesto bench ...``)."""
