"""Relax to ONNX: the door to the ``onnxruntime`` and ``openvino`` backends.

:func:`~tvm_pesto.backends.onnx_export.export.relax_to_onnx` writes a Relax function (a
candidate's region or a whole model) as an ONNX model of opset 17, one converter per Relax op
(:mod:`.ops`, with the index, math, nn and scatter families in :mod:`.index_ops`,
:mod:`.math_ops`, :mod:`.nn_ops`, :mod:`.scatter_ops`, on the graph writer of :mod:`.graph`;
:mod:`.fuse` rewrites a few patterns the libraries run faster). A call no converter can
compute exactly is refused with its reason and stays in TVM. :mod:`.coverage` lists every op
TVM's PyTorch and ONNX importers emit, with its converter or the reason it has none.
"""
