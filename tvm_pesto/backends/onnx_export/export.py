"""Convert a Relax function (a subgraph cut from ``main``) into an ONNX model.

Used by the TensorRT backend (ONNX -> TensorRT engine) and by the ONNX Runtime backend.
The model has one graph input per function parameter, one graph output per returned
tensor (a tuple result is flattened), and every constant becomes an initializer. Shapes
must be static. The opset is 17: old enough for TensorRT 8.6+ and every ONNX Runtime,
new enough for ``LayerNormalization``.

Each op goes through its converter in :mod:`tvm_pesto.backends.onnx_export.ops`, whose semantics follow
TVM's legalization of the op, so the ONNX model computes what the TVM build of the same function
computes (checked in ``tests/test_gpu_backends.py`` by running both on the CPU); the graph is
built by :class:`tvm_pesto.backends.onnx_export.graph.Exporter`.

Examples
--------
>>> import onnx
>>> from tvm_pesto.backends.onnx_export.export import relax_to_onnx
>>> from tvm_pesto.candidates.examples import tiny_mlp
>>> model = relax_to_onnx(tiny_mlp()[0]["main"])
>>> onnx.checker.check_model(model, full_check=True)
>>> [n.op_type for n in model.graph.node][:4]
['LayerNormalization', 'MatMul', 'Add', 'Div']
"""
from __future__ import annotations

import os

import numpy as np
import tvm
from tvm import relax

from .fuse import divide_by_reciprocals, fuse_hard_activations
from .graph import Exporter, OnnxExportError, dtype_of, elem_type, flat_types, tensor_shape
from .ops import CONVERTERS, SUPPORTED_OPS, call_problem

#: ONNX opset of the exported models.
OPSET = 17
#: :func:`write_onnx` writes initializers of this many bytes or more beside the graph, at
#: offsets that are multiples of :data:`EXTERNAL_ALIGN` (a page: mappable).
EXTERNAL_MIN_BYTES, EXTERNAL_ALIGN = 1 << 16, 4096
#: The exported graph's form, which decides a library's time as much as the subgraph does: a
#: cached timing of an earlier form is measured again (``a * Reciprocal(b)`` written as ``a / b``).
EXPORT_STAMP = "div-by-reciprocal"


def flatten_args(args) -> list:
    """Function arguments flattened the way :func:`relax_to_onnx` flattens tuple parameters.

    Examples
    --------
    >>> flatten_args([1, (2, (3, 4)), 5])
    [1, 2, 3, 4, 5]
    """
    out = []
    for a in args:
        if isinstance(a, (tuple, list)) or type(a).__name__ == "Array":
            out.extend(flatten_args(list(a)))
        else:
            out.append(a)
    return out


def _value_info(h, name: str, ty, what: str):
    return h.make_tensor_value_info(name, elem_type(dtype_of(ty), what), list(tensor_shape(ty, what)))


def _convert_call(e: Exporter, var, call: relax.Call):
    """The ONNX name(s) of one op call bound to ``var``, through the op's converter."""
    if not isinstance(call.op, tvm.ir.Op):
        raise OnnxExportError(f"binding {var.name!r} calls {call.op}, not a Relax operator; "
                              "only high-level ops export (cut the subgraph before legalization)")
    conv = CONVERTERS.get(call.op.name)
    if conv is None:
        raise OnnxExportError(f"op {call.op.name} (binding {var.name!r}) has no ONNX converter; "
                              f"it stays on a TVM backend (supported ops: {len(SUPPORTED_OPS)})")
    why = call_problem(call)
    if why is not None:  # a layout or attribute value ONNX has no exact form for
        raise OnnxExportError(f"op {call.op.name} (binding {var.name!r}) cannot be exported: {why}")
    return conv(e, call, e.fresh(var.name))


def relax_to_onnx(func: relax.Function, name: str = "pesto_subgraph", opset: int = OPSET):
    """Convert a Relax function into an ONNX model (its weights inside it: :func:`write_onnx`
    writes them beside it instead).

    Parameters
    ----------
    func : relax.Function
        A function of high-level Relax ops with static shapes (e.g. a subgraph from
        :func:`tvm_pesto.graph.subgraph.cut_function`). Constants become initializers.
    name : str
        The ONNX graph name.
    opset : int
        The default-domain opset (17 unless you know the consumer wants another).

    Returns
    -------
    onnx.ModelProto
        Graph inputs follow the parameters (named after them, made unique; a tuple
        parameter gives one input per field, see :func:`flatten_args`); graph outputs
        follow the flattened result, in order.

    Raises
    ------
    OnnxExportError
        For an op without a converter, a call whose layout or attribute values ONNX cannot
        compute exactly (:func:`~tvm_pesto.backends.onnx_export.ops.call_problem`), dynamic shapes, or a binding
        that is not a plain op call; the message names the op and binding.

    Examples
    --------
    >>> import numpy as np, onnx
    >>> from tvm import relax
    >>> bb = relax.BlockBuilder()
    >>> x = relax.Var("x", relax.TensorType((2, 3), "float32"))
    >>> with bb.function("main", [x]):
    ...     with bb.dataflow():
    ...         y = bb.emit(relax.op.nn.relu(relax.op.add(x, relax.const(np.ones((3,), "float32")))))
    ...         out = bb.emit_output(y)
    ...     _ = bb.emit_func_output(out)
    >>> model = relax_to_onnx(bb.get()["main"])
    >>> onnx.checker.check_model(model)
    >>> [n.op_type for n in model.graph.node], len(model.graph.initializer)
    (['Add', 'Relu'], 1)
    """
    return _export(func, name, opset, None)[0]


def _export(func: relax.Function, name: str, opset: int, external_min_bytes: int | None):
    """The ONNX model of ``func`` and its initializers left out (:class:`Exporter`)."""
    if not isinstance(func, relax.Function):
        raise OnnxExportError(f"relax_to_onnx expects a relax.Function, got {type(func).__name__}")
    e = Exporter(name, external_min_bytes)
    h = e.h
    inputs = []

    def add_input(base: str, ty, what: str):
        if isinstance(ty, relax.TensorType):
            nm = e.fresh(base)
            inputs.append(_value_info(h, nm, ty, what))
            return nm
        if isinstance(ty, (relax.TupleType, tvm.ir.TupleType)):
            # a tuple parameter becomes one graph input per field (flattened, in order)
            return [add_input(f"{base}_{k}", f, f"{what}[{k}]") for k, f in enumerate(ty.fields)]
        raise OnnxExportError(f"{what} is not a tensor or tuple of tensors ({ty})")

    for p in func.params:
        e.names[p] = add_input(p.name, p.ty, f"parameter {p.name!r}")
    body = func.body
    blocks = body.blocks if isinstance(body, relax.SeqExpr) else []
    for block in blocks:
        for b in block.bindings:
            if not isinstance(b, relax.VarBinding):
                raise OnnxExportError(f"binding of {b.var.name!r} is a {type(b).__name__}; only plain bindings export")
            val = b.value
            if isinstance(val, relax.Call):
                e.names[b.var] = _convert_call(e, b.var, val)
            else:
                e.names[b.var] = e.value(val, f"binding {b.var.name!r}")
    result = body.body if isinstance(body, relax.SeqExpr) else body
    res = e.value(result, "function result")
    flat = res if isinstance(res, list) else [res]
    out_types = flat_types(result.ty)
    if len(out_types) != len(flat):
        raise OnnxExportError("nested tuple results are not supported by the ONNX exporter")
    outputs = []
    taken: set[str] = set()
    for k, (nm, ty) in enumerate(zip(flat, out_types)):
        if nm not in e.produced or nm in taken:
            # An output that is an input, an initializer or a repeat gets its own node.
            nm = e.one("Identity", [nm], e.fresh(f"out{k}"))
        taken.add(nm)
        outputs.append(_value_info(h, nm, ty, f"result {k}"))
    nodes, inits = fuse_hard_activations(e.nodes, e.inits, keep={v.name for v in outputs})
    nodes = divide_by_reciprocals(nodes, keep={v.name for v in outputs})
    graph = h.make_graph(nodes, name, inputs, outputs, initializer=inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", int(opset))],
                         producer_name="tvm-pesto")
    model.ir_version = min(model.ir_version, 9)  # readable by onnxruntime and TensorRT parsers
    return model, e.external


def write_onnx(func: relax.Function, path: str, external_min_bytes: int | None = None,
               name: str = "pesto_subgraph") -> list[str]:
    """Export ``func`` to the ONNX file ``path``, each initializer of ``external_min_bytes`` or
    more (default :data:`EXTERNAL_MIN_BYTES`) in one weights file beside it (``<path>.data``: ONNX's external data, each tensor at a
    :data:`EXTERNAL_ALIGN` boundary, which ONNX Runtime and OpenVINO map rather than read).
    The weights are written from the constants' own memory: unlike :func:`relax_to_onnx` and
    its serialized bytes, no copy of a large model's weights is held in memory on the way.

    Returns
    -------
    list of str
        The names of the files written (the model's, then the weights' where there are any),
        in the folder of ``path``.

    Examples
    --------
    >>> import os, tempfile, numpy as np, onnx
    >>> from tvm_pesto.candidates.examples import tiny_mlp
    >>> func, path = tiny_mlp()[0]["main"], os.path.join(tempfile.mkdtemp(), "m.onnx")
    >>> write_onnx(func, path, external_min_bytes=1024)
    ['m.onnx', 'm.onnx.data']
    >>> lean = onnx.load(path, load_external_data=False)
    >>> sorted(t.dims[0] for t in lean.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL)
    [16, 32]
    >>> inside = {t.name: onnx.numpy_helper.to_array(t) for t in relax_to_onnx(func).graph.initializer}
    >>> all(np.array_equal(onnx.numpy_helper.to_array(t), inside[t.name])  # read from m.onnx.data
    ...     for t in onnx.load(path).graph.initializer)
    True
    """
    limit = EXTERNAL_MIN_BYTES if external_min_bytes is None else int(external_min_bytes)
    model, external = _export(func, name, OPSET, limit)
    folder, fname = os.path.split(os.fspath(path))
    data_name = f"{fname}.data"
    kept = [t for t in model.graph.initializer if t.name in external]  # the graph's copies of the stubs
    if kept:
        offset = 0
        with open(os.path.join(folder, data_name), "wb") as f:
            for t in kept:
                f.write(b"\0" * (-offset % EXTERNAL_ALIGN))
                offset += -offset % EXTERNAL_ALIGN
                data = memoryview(np.ascontiguousarray(external[t.name])).cast("B")
                f.write(data)
                for key, value in (("location", data_name), ("offset", offset), ("length", data.nbytes)):
                    entry = t.external_data.add()
                    entry.key, entry.value = key, str(value)
                t.data_location = t.EXTERNAL
                offset += data.nbytes
    with open(os.fspath(path), "wb") as f:
        f.write(model.SerializeToString())
    return [fname, data_name] if kept else [fname]
