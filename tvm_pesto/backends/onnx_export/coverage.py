"""What TVM's importers emit against what the ONNX exporter converts.

:func:`importer_ops` reads the Relax operators that TVM's PyTorch importer
(``from_exported_program``, with its FX base) and ONNX importer call, from the importers'
own sources. Each either has a converter (:data:`tvm_pesto.backends.onnx_export.ops.CONVERTERS`)
or is listed in :data:`UNCONVERTED` with why not; a call of an unconverted op stays in TVM
while the libraries run the rest. ``tests/test_onnx_coverage.py`` checks both, and runs one
tiny module per converter in ONNX Runtime and OpenVINO against TVM's build.

Examples
--------
>>> from tvm_pesto.backends.onnx_export.coverage import UNCONVERTED, importer_ops
>>> ops = importer_ops()
>>> len(ops) > 100, "relax.nn.conv2d" in ops, UNCONVERTED["relax.nonzero"].startswith("data-dependent")
(True, True, True)
"""
from __future__ import annotations

import os
import re

#: Importer sources, relative to the ``tvm`` package.
IMPORTERS = ("relax/frontend/torch/base_fx_graph_translator.py",
             "relax/frontend/torch/exported_program_translator.py",
             "relax/frontend/onnx/onnx_frontend.py")

_FOLDED = "folded before candidates are made when its arguments are numbers (graph/fold.py); else shape-only"
_SHAPE = "a shape or scalar value, not a tensor computation: nothing for a library to run"
_DYNAMIC = "data-dependent output shape: the exporter needs static shapes"
_DTYPE = "integer quantization types the exporter does not write (float and int32/int64/bool only)"
_TRAINING = "a training-only op: inference models do not run it"
_VISION = "detection post-processing (boxes, regions): not in the classification and language models placed"
_NO_OP17 = "no ONNX opset-17 operator computes it exactly"

#: Relax operator -> why the exporter does not convert it.
UNCONVERTED: dict[str, str] = {
    **dict.fromkeys(["relax.arange", "relax.eye", "relax.eye_like", "relax.hamming_window"], _FOLDED),
    **dict.fromkeys(["relax.shape_of", "relax.shape_to_tensor", "relax.tensor_to_shape", "relax.size",
                     "relax.null_value", "relax.assert_op"], _SHAPE),
    **dict.fromkeys(["relax.nonzero", "relax.unique", "relax.dynamic_strided_slice"], _DYNAMIC),
    **dict.fromkeys(["relax.quantize", "relax.dequantize"], _DTYPE),
    **dict.fromkeys(["relax.nn.nll_loss", "relax.nn.dropout"], _TRAINING),
    **dict.fromkeys(["relax.vision.all_class_non_max_suppression", "relax.vision.roi_align",
                     "relax.vision.roi_pool", "relax.image.affine_grid", "relax.image.grid_sample"], _VISION),
    "relax.cumprod": _NO_OP17,
    # Python helpers of the importers that emit other ops (matmul and add), not ops of their own
    "relax.linear": "a helper that emits relax.matmul and relax.add, each converted",
    "relax.linear_algebra.matmul": "the module path of relax.matmul, converted",
}


def importer_ops() -> set[str]:
    """The Relax operators (``relax.<name>``) TVM's PyTorch and ONNX importers call, read from
    their sources in the installed ``tvm`` package."""
    # lazy: only this reading of the importers needs to know where TVM is installed
    import tvm

    base = os.path.dirname(tvm.__file__)
    ops: set[str] = set()
    for rel in IMPORTERS:
        with open(os.path.join(base, rel)) as f:
            src = f.read()
        ops |= {"relax." + m for m in re.findall(r"relax\.op\.((?:[a-z_]+\.)*[a-z_0-9]+)\(", src)}
    return ops


__all__ = ["IMPORTERS", "UNCONVERTED", "importer_ops"]
