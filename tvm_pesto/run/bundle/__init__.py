"""An exported placed model: the bundle format, checked file by file
(:mod:`~tvm_pesto.run.bundle.format`), its loader (:mod:`~tvm_pesto.run.bundle.load`, what
:func:`tvm_pesto.load` calls), and TVM's Python package without its compiler, what a machine
needs to run a bundle (:mod:`~tvm_pesto.run.bundle.runtime_pkg`)."""
