"""TorchInductor on the CPU: a region of the ``torch`` backend's ops compiled into one program.

A subgraph function is translated into the ``torch`` backend's call list
(:class:`~tvm_pesto.backends.torch_ops.TorchProgram`), traced once with ``torch.export``
(:func:`~tvm_pesto.backends.torch_ops.exported_subgraph`; the build-time constants become the program's constants) and
compiled by ``torch.compile(backend="inductor")`` at build time: the unit is called once on
zeros before it is registered, so a placed model never compiles. Inductor emits C++ (OpenMP
loops over the fused element-wise ops; matmul and convolution as oneDNN/MKL calls) and builds
it with the machine's C++ compiler, which :meth:`InductorBackend.available` checks.

Compiles are kept in Inductor's own on-disk caches (its FX graph cache, in
``$TORCHINDUCTOR_CACHE_DIR``, default ``<tmp>/torchinductor_<user>``): a unit built again in
a new process, or a unit of the same graph with other weights, skips the C++ compile. The
seconds each build took are the unit callable's ``build_s``
(``backend.built(gname).fn.build_s``).

Threads: the device's core count, both in the generated code (``cpp.threads``: Inductor
writes the OpenMP thread count into it) and for the library calls (``torch.set_num_threads``
before each call, as the ``torch`` backend does: :func:`tvm_pesto.run.libraries.loaders.torch_runner`).

Bundles hold an AOTInductor package per unit (``aoti_compile_and_package``, ``.pt2``): the
compiled shared library and the weights, loaded with ``aoti_load_package``
(:func:`tvm_pesto.run.libraries.loaders.load_inductor_aoti`), so loading a bundle never compiles.

Examples
--------
>>> import tvm
>>> from tvm_pesto.backends import get_backend
>>> from tvm_pesto.candidates.examples import tiny_mlp
>>> from tvm_pesto.cluster import parse_cluster
>>> bk = get_backend("inductor")
>>> mod, (x,) = tiny_mlp()
>>> if bk.available()[0]:
...     gname = bk.build(mod["main"], parse_cluster("cpu:1").devices[0])   # compiles (seconds)
...     out = tvm.runtime.empty((8, 16), "float32", tvm.cpu())
...     tvm.get_global_func(gname)(tvm.runtime.tensor(x), out)
...     assert bk.built(gname).fn.build_s > 0
"""
from __future__ import annotations

import os
import time

from tvm import relax

from ..errors import BuildError, error_line
from ..run.libraries.loaders import torch_runner
from .base import device_cores, output_types, static_shape
from .torch_ops import TorchBackend, _tdtype, exported_subgraph


def inductor_options(cores: int) -> dict:
    """Inductor's settings for a unit of a ``cores``-core device: that many OpenMP threads in
    the generated code (Inductor writes the count into it at compile time)."""
    return {"cpp.threads": int(cores)}


def cpp_compiler() -> str:
    """The C++ compiler Inductor uses (its own search: ``$CXX``, else ``g++``, each run with
    ``--version``).

    Raises
    ------
    Exception
        Inductor's ``InvalidCxxCompiler`` when none works.
    """
    from torch._inductor.cpp_builder import get_cpp_compiler

    return get_cpp_compiler()


class InductorBackend(TorchBackend):
    """TorchInductor (``torch.compile``), whole regions at a time (graph-level, CPU).

    The ops and predicates are the ``torch`` backend's (this class is that backend with
    another build). Only convex regions of them and windows of regions are offered, no
    op-level chains: Inductor's gain over the ``torch`` backend's calls is fusion across a
    region, and each unit costs a compile. Until the cost model is trained on it, ``xgb``
    predicts its candidates as ``torch`` units: the same ATen/oneDNN kernels for matmul and
    convolution, the same call lists; its fusion of element-wise ops is what it may gain.

    ``all`` leaves it out (:data:`~tvm_pesto.backends.registry.NAMED_ONLY`): it competes
    only when named (``backends=["inductor"]``, ``--backends inductor,tvm``).
    """

    name = "inductor"
    build_s_guess = (0.6, 0.13)  # C++ compiled: 0.7 s a 1-5-op region, 7.5-8.9 s 56 ops (Xeon, 2 vCPUs)
    graph_level = True
    cost_proxy = "torch"

    def patterns(self):
        return []

    def available(self) -> tuple[bool, str]:
        ok, why = super().available()
        if not ok:
            return ok, why
        try:
            cpp_compiler()
        except Exception as e:  # noqa: BLE001 - Inductor's check failed: report it with the fix
            return False, (f"TorchInductor finds no working C++ compiler ({error_line(e)}); install "
                           "one (`apt-get install g++`) or set CXX to a C++ compiler on PATH")
        return True, ""

    def make_callable(self, func: relax.Function, device):
        import torch

        t0 = time.perf_counter()
        cores = device_cores(device)
        compiled = torch.compile(exported_subgraph(func).module(), backend="inductor", dynamic=False,
                                 fullgraph=True, options=inductor_options(cores))
        run = torch_runner(compiled, len(func.params), cores)
        ins = [torch.zeros(static_shape(p.ty), dtype=_tdtype(p.ty.dtype)) for p in func.params]
        outs = [torch.empty(static_shape(t), dtype=_tdtype(t.dtype)) for t in output_types(func)]
        threads = torch.get_num_threads()
        try:
            run(*ins, *outs)  # compiles now, through the call the unit makes (no grad, these shapes)
        finally:
            torch.set_num_threads(threads)
        run.build_s = time.perf_counter() - t0
        return run

    def export_artifact(self, func: relax.Function, device, out_dir: str, stem: str) -> dict:
        """The subgraph as an AOTInductor package (``.pt2``: the compiled library and its
        weights), compiled for the device's core count."""
        import torch

        fname = f"{stem}.pt2"
        ep = exported_subgraph(func)
        try:
            torch._inductor.aoti_compile_and_package(ep, package_path=os.path.join(out_dir, fname),
                                                     inductor_configs=inductor_options(device_cores(device)))
        except Exception as e:  # noqa: BLE001 - AOTInductor's own error, explained
            raise BuildError(f"AOTInductor could not package the inductor unit {stem}: {error_line(e)}; "
                             "build the model without the inductor backend to export it") from e
        return {"kind": "inductor-aoti", "files": [fname]}

