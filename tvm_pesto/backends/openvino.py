"""OpenVINO on the CPU: a whole subgraph becomes one ONNX model compiled by OpenVINO (graph-level).

The subgraph function is exported with :func:`tvm_pesto.backends.onnx_export.relax_to_onnx`,
as for ONNX Runtime (same ops, same candidates: :class:`~tvm_pesto.backends.onnxruntime.OnnxGraphBackend`),
and compiled with the device's core count as OpenVINO's inference threads
(:func:`tvm_pesto.run.loaders.openvino_model`). At run time OpenVINO reads TVM's input
tensors and writes the DPS output tensors in place (:func:`tvm_pesto.run.loaders.openvino_runner`,
which a deployed bundle uses too: its artifact is the ONNX file, compiled again when loaded).

Examples
--------
>>> import tvm
>>> from tvm_pesto.backends import get_backend
>>> from tvm_pesto.candidates.examples import tiny_mlp
>>> from tvm_pesto.cluster import parse_cluster
>>> bk = get_backend("openvino")
>>> mod, (x,) = tiny_mlp()
>>> if bk.available()[0]:
...     gname = bk.build(mod["main"], parse_cluster("cpu:1").devices[0])
...     out = tvm.runtime.empty((8, 16), "float32", tvm.cpu())
...     tvm.get_global_func(gname)(tvm.runtime.tensor(x), out)
"""
from __future__ import annotations

from tvm import relax

from ..run.loaders import openvino_runner
from .base import device_cores
from .onnx_export import relax_to_onnx
from .onnxruntime import OnnxGraphBackend


class OpenVinoBackend(OnnxGraphBackend):
    """OpenVINO's CPU plugin, whole subgraphs at a time (graph-level).

    One compiled model per subgraph and core count, made at build time: ``cores`` inference
    threads, the latency hint, float32 precision, and OpenVINO's own CPU pinning off (it
    would move the calling device thread off its cores; see
    :func:`~tvm_pesto.run.loaders.openvino_model`).
    """

    name = "openvino"
    build_s_guess = (0.012, 0.0006)  # compile_model (1,884 builds of 1-194 ops, Xeon, 2 vCPUs)
    artifact_kind = "openvino"
    cost_proxy = "onnxruntime"  # another whole-graph CPU library on the same ONNX, until trained on

    def available(self) -> tuple[bool, str]:
        try:
            import onnx  # noqa: F401
            import openvino as ov
        except Exception as e:  # noqa: BLE001 - any import failure makes the backend unavailable, with the cause
            return False, (f"openvino/onnx cannot be imported ({type(e).__name__}: {e}); "
                           "install them with `pip install openvino onnx` (or `pip install tvm-pesto[openvino]`)")
        try:
            devices = ov.Core().available_devices
        except Exception as e:  # noqa: BLE001 - a broken install or plugin: report it
            return False, f"openvino cannot list its devices ({type(e).__name__}: {e}); reinstall openvino"
        if "CPU" not in devices:
            return False, (f"openvino has no CPU device here (it lists {', '.join(devices) or 'none'}); "
                           "reinstall openvino for this CPU")
        return True, ""

    def make_callable(self, func: relax.Function, device):
        return openvino_runner(relax_to_onnx(func).SerializeToString(), device_cores(device))
