"""Stage 6: run per-device modules together and record what really happened.

Nothing here needs TVM's compiler: a deployed bundle runs with TVM's runtime only, and the
package imports nothing but :mod:`tvm_pesto.errors` and :mod:`tvm_pesto.cluster` (the
compiler side, ``backends`` and ``builder``, imports it; docs/architecture.md, "Layers").

* :mod:`~tvm_pesto.run.program`: the :class:`Program` every executor runs (steps per device);
* :mod:`~tvm_pesto.run.runtime`: :class:`~tvm_pesto.run.runtime.PlacedRuntime`, a placed
  model ready to call (what :func:`tvm_pesto.load` returns and a built model extends), with
  torch tensors in and out (:mod:`~tvm_pesto.run.torch_io`);
* :mod:`~tvm_pesto.run.thread`: the in-process executor, one pinned thread per device (GPU
  streams, pipelined microbatches);
* :mod:`~tvm_pesto.run.ray`: the multi-machine executor, one Ray actor per device;
* :mod:`~tvm_pesto.run.libraries`: the backends' deployed callables (ONNX Runtime, OpenVINO,
  PyTorch, AOTInductor, TVM VM executables) and the libraries' calls at their floor;
* :mod:`~tvm_pesto.run.bundle`: the bundle format, its loader (:func:`tvm_pesto.load`) and
  TVM's runtime package without its compiler.
"""
from .program import Program, Step
from .thread.executor import Executor, TraceEvent

__all__ = ["Executor", "Program", "Step", "TraceEvent"]
