"""What the product itself times on this machine, through the runtime (:mod:`tvm_pesto.run`).

* :mod:`~tvm_pesto.measure.dispatch`: the executors' dispatch, links and the devices'
  contention, fitted as this machine's constants on first use and kept (it compiles its
  kernels and reads the cost model's machine key, so it sits above the runtime and ``costs``);
* :mod:`~tvm_pesto.measure.blocks`: built options timed against each other in blocks (the
  final choice, :mod:`tvm_pesto.decide`, and the benchmarks).

A deployed bundle never imports this package.
"""
