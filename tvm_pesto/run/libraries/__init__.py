"""The runtime side of the library backends: the callables a deployed bundle's artifacts
become (:mod:`~tvm_pesto.run.libraries.loaders`, the same ones the backends build), and a
library's call on numpy arrays at its floor (:mod:`~tvm_pesto.run.libraries.calls`)."""
