"""Timing candidates on real devices: the ``measured`` cost source (:mod:`.measured`: every
backend's candidates, through the path the placed module uses), TVM fusion groups and whole
models (:mod:`.timing`), timing against reference kernels on a shared machine
(:mod:`.interleave`), devices behind a TVM RPC tracker (:mod:`.remote`), and the seconds a
candidate takes to build (:mod:`.build_time`); and built options timed against each other in
blocks (:mod:`.blocks`: the final choice, the benchmarks).

Imports :mod:`tvm_pesto.costs.store` and :mod:`tvm_pesto.costs.table`.
"""
