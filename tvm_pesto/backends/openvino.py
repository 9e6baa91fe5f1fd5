"""OpenVINO on the CPU: a whole subgraph becomes one ONNX model compiled by OpenVINO (graph-level).

The subgraph function is exported with :func:`tvm_pesto.backends.onnx_export.export.relax_to_onnx`,
as for ONNX Runtime (same ops, same candidates: :class:`~tvm_pesto.backends.onnxruntime.OnnxGraphBackend`),
and compiled with the device's core count as OpenVINO's inference threads
(:func:`tvm_pesto.run.libraries.loaders.openvino_model`). At run time OpenVINO reads TVM's input
tensors and writes the DPS output tensors in place (:func:`tvm_pesto.run.libraries.loaders.openvino_runner`,
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

from ..run.libraries.loaders import openvino_runner
from .base import device_cores
from .onnx_export.ops import openvino_problem
from .onnxruntime import OnnxGraphBackend, onnx_model


class OpenVinoBackend(OnnxGraphBackend):
    """OpenVINO's CPU plugin, whole subgraphs at a time (graph-level).

    One compiled model per subgraph and core count, made at build time: ``cores`` inference
    threads, the latency hint, float32 precision, and OpenVINO's own CPU pinning off (it
    would move the calling device thread off its cores; see
    :func:`~tvm_pesto.run.libraries.loaders.openvino_model`).
    """

    name = "openvino"
    build_s_guess = (0.012, 0.0006)  # compile_model (1,884 builds of 1-194 ops, Xeon, 2 vCPUs)
    artifact_kind = "openvino"
    cost_proxy = "onnxruntime"  # another whole-graph CPU library on the same ONNX, until trained on
    #: OpenVINO's inference precision (:func:`tvm_pesto.run.libraries.loaders.openvino_model`)
    precision = "f32"

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

    def supports_op(self, call) -> bool:
        """As ONNX Runtime, less the calls OpenVINO computes otherwise than ONNX defines
        (:func:`~tvm_pesto.backends.onnx_export.ops.openvino_problem`: unstable sorts, a pool's last window)."""
        return super().supports_op(call) and openvino_problem(call) is None

    def make_callable(self, func: relax.Function, device):
        return openvino_runner(onnx_model(func), device_cores(device), self.precision)

    def artifact_meta(self) -> dict:
        return {} if self.precision == "f32" else {"precision": self.precision}


class OpenVinoBf16Backend(OpenVinoBackend):
    """OpenVINO computing in bfloat16 (OpenVINO's own default on CPUs with bfloat16 units:
    AVX512-BF16, AMX): faster on such CPUs, accurate to about 1e-2 relative instead of
    float32's 1e-6. Offered only when named (``--backends all,openvino-bf16``;
    :data:`~tvm_pesto.backends.registry.NAMED_ONLY`): a plan in reduced precision is the user's
    choice, and the run report's error against the single-device build says what it cost.
    """

    name = "openvino-bf16"
    precision = "bf16"
    cost_proxy = "openvino"  # the same library; predicted as its float32 units until trained on

    def available(self) -> tuple[bool, str]:
        ok, why = super().available()
        if not ok:
            return ok, why
        import openvino as ov

        try:
            caps = list(ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"))
        except Exception as e:  # noqa: BLE001 - a plugin that cannot say: report it
            return False, f"openvino cannot list the CPU's capabilities ({type(e).__name__}: {e}); reinstall openvino"
        if "BF16" not in caps:
            return False, (f"this CPU has no bfloat16 units (OpenVINO lists {', '.join(caps) or 'none'}), so OpenVINO "
                           "would compute in float32 here; use the openvino backend")
        return True, ""

