"""Import PyTorch and ONNX models into Relax, and check that they are static.

tvm-pesto places the operators of a Relax ``main`` function on devices, so it needs the
model as an :class:`tvm.IRModule` whose shapes are all known. The importers here wrap
TVM's frontends with the options tvm-pesto needs (weights bound as constants, a single
tensor returned when the model returns one) and turn frontend failures into
:class:`~tvm_pesto.errors.UnsupportedModuleError`, naming the operators the frontend does
not support when it says which. :func:`from_exported_program` is the one path from a
``torch.export`` program to Relax (:func:`from_torch` exports, then calls it).
:mod:`tvm_pesto.models` turns a zoo name or a model file into a module with these functions.
"""
from __future__ import annotations

import os
import re
from typing import Any, Sequence

import numpy as np
import tvm
from tvm import relax

from .errors import UnsupportedModuleError, error_line

__all__ = ["INT_INPUT_RANGE", "from_torch", "from_exported_program", "from_onnx", "read_onnx", "unsupported_ops",
           "error_line", "check_static", "symbolic_dims"]

#: Integer example inputs (token ids, indices) are drawn uniformly from ``[low, high)``: valid
#: for any vocabulary or axis of size >= 2 (:func:`tvm_pesto.models.random_inputs`, the
#: text models of :mod:`tvm_pesto.zoo.outside`).
INT_INPUT_RANGE = (0, 2)


def _model_name(model: Any, name: str | None) -> str:
    return name if name else type(model).__name__


def _aten_batch_norm(node: Any, importer: Any) -> relax.Var:
    """Convert ``aten.batch_norm.default`` (inference or training mode).

    TVM 0.27 maps this op to its ``_native_batch_norm_legit_no_training`` converter, which
    reads the arguments with the wrong signature (``training`` as momentum, momentum as
    epsilon) and emits a training-mode batch norm, so an eval-mode BatchNorm computes
    batch statistics (and a train-mode one gets ``epsilon=momentum``). The op's signature
    is ``(input, weight, bias, running_mean, running_var, training, momentum, eps,
    cudnn_enabled)``. A model exported in train mode gives ``relax.nn.batch_norm(...,
    training=True)``, whose results 1 and 2 are the updated running statistics
    (:mod:`tvm_pesto.train.backbone` turns them into training states).
    """
    names = ("input", "weight", "bias", "running_mean", "running_var", "training", "momentum", "eps")

    def arg(i: int, default: Any = None) -> Any:
        return node.args[i] if len(node.args) > i else node.kwargs.get(names[i], default)

    if arg(3) is None or arg(4) is None:
        # no running statistics: let from_torch retry through the decomposed path
        raise NotImplementedError("batch_norm without running statistics")
    x = importer.env[arg(0)]
    channels = int(importer.shape_of(x)[1])
    dtype = x.ty.dtype.dtype

    def tensor(i: int, fill: float) -> relax.Expr:
        return importer.env[arg(i)] if arg(i) is not None else relax.const(np.full(channels, fill), dtype)

    bn = importer.block_builder.emit(relax.op.nn.batch_norm(
        x, tensor(1, 1.0), tensor(2, 0.0), tensor(3, 0.0), tensor(4, 1.0), axis=1,
        epsilon=float(arg(7, 1e-5)), center=True, scale=True, momentum=float(arg(6, 0.1) or 0.1),
        training=bool(arg(5, False))))
    return importer.block_builder.emit(relax.TupleGetItem(bn, 0))


def _to_torch_args(example_args: Sequence[Any]) -> tuple:
    import torch

    if not isinstance(example_args, (tuple, list)):
        example_args = (example_args,)
    out = []
    for a in example_args:
        if isinstance(a, np.ndarray):
            a = torch.from_numpy(np.ascontiguousarray(a))
        out.append(a)
    return tuple(out)


#: Converters that replace TVM's for ops the direct (undecomposed) import gets wrong.
def _aten_to_device(node: Any, importer: Any) -> relax.Var:
    """Convert ``aten.to.device(input, device, dtype, ...)``, which TVM 0.27's importer lacks
    (timm's EdgeNeXt makes a mask with it): on the one host the device is the input's, so
    the op is its cast to ``dtype``."""
    x = importer.env[node.args[0]]
    dtype = node.args[2] if len(node.args) > 2 else node.kwargs.get("dtype")
    if dtype is None:
        return x
    return importer.block_builder.emit(relax.op.astype(x, str(dtype).removeprefix("torch.")))


def _aten_div_mode(node: Any, importer: Any) -> relax.Var:
    """Convert ``aten.div.Tensor_mode(a, b, rounding_mode=...)``: TVM 0.27's converter makes a
    Python number operand an ``int32`` constant whatever the tensor's dtype (timm's EdgeNeXt
    floor-divides float positions by 2, which Relax then refuses); here a number takes the
    other operand's dtype. Integer truncation is left to TVM's own converter."""
    a, b = node.args[:2]
    tensor = importer.env[a] if hasattr(a, "op") else importer.env[b]
    dtype = tensor.ty.dtype.dtype if hasattr(tensor.ty.dtype, "dtype") else str(tensor.ty.dtype)
    x, y = (importer.env[v] if hasattr(v, "op") else relax.const(v, dtype) for v in (a, b))
    mode = node.kwargs.get("rounding_mode", node.args[2] if len(node.args) > 2 else None)
    bb = importer.block_builder
    if mode is None:
        return bb.emit(relax.op.divide(x, y))
    if mode == "floor":
        return bb.emit(relax.op.floor_divide(x, y))
    if dtype.startswith("float"):
        return bb.emit(relax.op.trunc(bb.emit(relax.op.divide(x, y))))
    raise NotImplementedError(f"div with rounding_mode {mode!r} of {dtype}")


_CUSTOM_CONVERTERS = {"batch_norm.default": _aten_batch_norm, "to.device": _aten_to_device,
                      "div.Tensor_mode": _aten_div_mode}

#: How TVM's importers name the operators they cannot convert (the list is group 1).
_UNSUPPORTED_PATTERNS = (
    re.compile(r"Unsupported function types \[([^\]]*)\]"),               # PyTorch importer
    re.compile(r"operators are not supported for frontend ONNX: ([^\n]+)"),  # ONNX, whole graph
    re.compile(r"Operator (\S+) not implemented"),                         # ONNX, one node
)


def unsupported_ops(exc: BaseException) -> list[str]:
    """The operators a TVM frontend error says it cannot convert.

    Looks through ``exc`` and its chained causes for the messages of TVM's PyTorch importer
    (``Unsupported function types ['erfinv.default']``) and ONNX importer (``The following
    operators are not supported for frontend ONNX: Celu``).

    Parameters
    ----------
    exc : BaseException
        An exception raised by a Relax frontend.

    Returns
    -------
    list of str
        Sorted operator names; empty when the message names none.

    Examples
    --------
    >>> from tvm_pesto.frontend import unsupported_ops
    >>> unsupported_ops(AssertionError("Unsupported function types ['erfinv.default', 'histc.default']"))
    ['erfinv.default', 'histc.default']
    >>> unsupported_ops(ValueError("shape mismatch"))
    []
    """
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        text = str(exc)
        for pattern in _UNSUPPORTED_PATTERNS:
            m = pattern.search(text)
            if m:
                return sorted({op.strip().strip("'\"") for op in m.group(1).split(",") if op.strip()})
        exc = exc.__cause__ or exc.__context__
    return []


def from_torch(model: Any, example_args: Sequence[Any], name: str | None = None, *,
               decompose: bool = False) -> tvm.IRModule:
    """Import a PyTorch module into a Relax module with its weights bound as constants.

    The model is put in eval mode, exported with :func:`torch.export.export` at the shapes
    of ``example_args`` (so every shape is static) and translated with
    :func:`from_exported_program`.

    Parameters
    ----------
    model : torch.nn.Module
        The model to import.
    example_args : sequence of torch.Tensor or numpy.ndarray
        One example per positional input; their shapes and dtypes become the input types.
    name : str, optional
        Name used in error messages (default: the class name of ``model``).
    decompose : bool
        Passed to :func:`from_exported_program`.

    Returns
    -------
    tvm.IRModule
        A module whose ``main`` takes the model inputs and returns its output(s).

    Raises
    ------
    UnsupportedModuleError
        If ``torch.export`` or the Relax importer fails; the message names the model
        and the unsupported operators or the first line of the cause (the full error is
        chained as ``__cause__``).

    Examples
    --------
    >>> import torch
    >>> from tvm_pesto.frontend import from_torch
    >>> mod = from_torch(torch.nn.Linear(4, 2), (torch.zeros(1, 4),), name="linear")
    >>> [str(p.ty.shape) for p in mod["main"].params]
    ['R.shape([1, 4])']
    """
    import torch

    label = _model_name(model, name)
    args = _to_torch_args(example_args)
    try:
        model = model.eval()
        with torch.no_grad():
            ep = torch.export.export(model, args)
    except Exception as exc:  # torch raises many unrelated types here
        raise UnsupportedModuleError(
            f"torch.export failed for model {label!r}: {error_line(exc)}. "
            "Make the model exportable (no data-dependent control flow, tensors-only inputs) "
            "or export it to ONNX and use from_onnx") from exc
    return from_exported_program(ep, label, decompose=decompose)


def from_exported_program(ep: Any, name: str = "exported program", *, decompose: bool = False,
                          keep_params_as_input: bool = False) -> tvm.IRModule:
    """Translate a ``torch.export`` program into a Relax module with its weights as constants.

    This is the one path from an :class:`torch.export.ExportedProgram` to Relax, for models
    exported here (:func:`from_torch`) and for programs loaded with :func:`torch.export.load`.
    It calls :func:`tvm.relax.frontend.torch.from_exported_program`. When the program returns
    one tensor, ``main`` returns that tensor (not a 1-tuple); several outputs stay a tuple.
    BatchNorm in eval mode becomes ``relax.nn.batch_norm(..., training=False)`` (TVM's own
    converter reads its arguments in the wrong order). Symbolic shapes of a program exported
    with ``dynamic_shapes`` stay symbolic.

    Parameters
    ----------
    ep : torch.export.ExportedProgram
        The program to translate.
    name : str
        Name used in error messages (a model or file name).
    decompose : bool
        Run PyTorch's decomposition to core ATen ops before translating. By default the
        exported ops are translated directly, and the decomposition is used only when that
        fails.
    keep_params_as_input : bool
        Keep the trainable parameters as parameters of ``main`` after the user inputs
        (attribute ``num_input`` = number of user inputs, ``params`` = their values, in
        ``named_parameters()`` order) instead of binding them as constants; buffers stay
        constants. Training (:mod:`tvm_pesto.train`) imports this way.

    Returns
    -------
    tvm.IRModule
        A module whose ``main`` takes the program's user inputs.

    Raises
    ------
    UnsupportedModuleError
        If the importer fails both ways; the message names the operators it does not
        support when it says which, otherwise the first line of the cause.

    Examples
    --------
    >>> import torch
    >>> from tvm_pesto.frontend import from_exported_program
    >>> ep = torch.export.export(torch.nn.ReLU(), (torch.zeros(2, 3),))
    >>> str(from_exported_program(ep, "relu")["main"].ret_ty)
    'R.Tensor((2, 3), dtype="float32")'
    """
    from tvm.relax.frontend.torch import from_exported_program as _relax_from_exported_program

    # Without PyTorch's decomposition the importer converts the exported ATen ops
    # directly: ~25x faster and closer to the model's layers (e.g. BERT-small: 72 op
    # bindings instead of 116). Ops the direct path cannot convert get a second try with
    # the decomposition into core ATen ops.
    failures = []
    for run_decomposition in ([True] if decompose else [False, True]):
        try:
            return _relax_from_exported_program(
                ep, keep_params_as_input=keep_params_as_input, unwrap_unit_return_tuple=True,
                run_ep_decomposition=run_decomposition, custom_convert_map=_CUSTOM_CONVERTERS)
        except Exception as exc:
            failures.append(exc)
    first_ops, last_ops = unsupported_ops(failures[0]), unsupported_ops(failures[-1])
    ops = first_ops or last_ops
    if ops:
        detail = f"uses operator(s) the Relax PyTorch importer does not support: {', '.join(ops)}"
        if len(failures) > 1 and last_ops and last_ops != ops:
            detail += f" (after decomposition into core ATen ops: {', '.join(last_ops)})"
        elif len(failures) > 1 and not last_ops:
            detail += f"; the retry after decomposition into core ATen ops failed too: {error_line(failures[-1])}"
        fix = "Replace these operators in the model, or export it to ONNX and load that file"
    else:
        detail = f"failed in the Relax PyTorch importer: {error_line(failures[-1])}"
        fix = "Replace the unsupported operator in the model or import it through ONNX (from_onnx)"
    raise UnsupportedModuleError(f"model {name!r} {detail}. {fix}") from failures[-1]


def read_onnx(path: str | os.PathLike) -> Any:
    """Read an ONNX file (with external data next to it, if any).

    Parameters
    ----------
    path : str or os.PathLike
        The ``.onnx`` file.

    Returns
    -------
    onnx.ModelProto

    Raises
    ------
    UnsupportedModuleError
        If the file cannot be read or parsed; the message names the file and the parser's
        first line of error.
    """
    import onnx

    label = os.fspath(path)
    try:
        return onnx.load(label)
    except Exception as exc:
        raise UnsupportedModuleError(
            f"cannot read ONNX model {label!r}: {error_line(exc)}. "
            "Pass the path of a valid .onnx file or an onnx.ModelProto") from exc


def from_onnx(path_or_model: Any, shape_dict: dict[str, Sequence[int]] | None = None,
              name: str | None = None) -> tvm.IRModule:
    """Import an ONNX model into a Relax module with its weights bound as constants.

    Parameters
    ----------
    path_or_model : str, os.PathLike or onnx.ModelProto
        A ``.onnx`` file or a loaded model.
    shape_dict : dict of str to sequence of int, optional
        Fixed shapes for inputs whose ONNX shapes are symbolic (e.g. ``{"x": [1, 3, 224, 224]}``).
    name : str, optional
        Name used in error messages (default: the path, or the graph's name).

    Returns
    -------
    tvm.IRModule
        A module whose ``main`` takes the ONNX graph inputs.

    Raises
    ------
    UnsupportedModuleError
        If the file cannot be read or the Relax ONNX importer fails; the message names the
        operators the importer does not support when it says which.

    Examples
    --------
    >>> import io, onnx, torch
    >>> from tvm_pesto.frontend import from_onnx
    >>> buf = io.BytesIO()
    >>> torch.onnx.export(torch.nn.Linear(4, 2), (torch.zeros(1, 4),), buf, dynamo=False,
    ...                   input_names=["x"])
    >>> mod = from_onnx(onnx.load_from_string(buf.getvalue()))
    >>> [p.name for p in mod["main"].params]
    ['x']
    """
    from tvm.relax.frontend.onnx import from_onnx as _relax_from_onnx

    if isinstance(path_or_model, (str, os.PathLike)):
        label = name or os.fspath(path_or_model)
        model = read_onnx(path_or_model)
    else:
        model = path_or_model
        label = name or getattr(getattr(model, "graph", None), "name", "") or "onnx model"
    shapes = {k: [int(d) for d in v] for k, v in shape_dict.items()} if shape_dict else None
    try:
        return _relax_from_onnx(model, shape_dict=shapes, keep_params_in_input=False)
    except Exception as exc:
        ops = unsupported_ops(exc)
        if ops:
            raise UnsupportedModuleError(
                f"ONNX model {label!r} uses operator(s) the Relax ONNX importer does not support: "
                f"{', '.join(ops)}. Replace them in the model, or export it with an opset in which "
                "the exporter decomposes them") from exc
        raise UnsupportedModuleError(
            f"the Relax ONNX importer failed for {label!r}: {error_line(exc)}. "
            "Check the opset and operators, or give static input shapes with shape_dict") from exc


def _type_dynamic_dims(ty: Any) -> list[str]:
    """Descriptions of the non-constant dimensions in a Relax type (empty when static)."""
    if isinstance(ty, relax.TensorType):
        if ty.shape is None:
            return ["unknown shape" if ty.ndim < 0 else f"unknown shape of rank {ty.ndim}"]
        return [str(v) for v in ty.shape.values if not isinstance(v, tvm.tirx.IntImm)]
    if isinstance(ty, relax.ShapeType):
        if ty.values is None:
            return ["unknown shape value"]
        return [str(v) for v in ty.values if not isinstance(v, tvm.tirx.IntImm)]
    if isinstance(ty, (relax.TupleType, tvm.ir.TupleType)):
        out = []
        for f in ty.fields:
            out.extend(_type_dynamic_dims(f))
        return out
    return []


def symbolic_dims(mod: tvm.IRModule, func: str = "main") -> list[tuple[str, str, list[str]]]:
    """List the variables of ``func`` whose types have symbolic or unknown dimensions.

    Parameters
    ----------
    mod : tvm.IRModule
        The module to inspect.
    func : str
        The function to inspect (default ``"main"``).

    Returns
    -------
    list of (kind, name, dims)
        ``kind`` is ``"parameter"`` or ``"binding"``, ``name`` the variable name and ``dims``
        the offending dimensions as text; empty when everything is static.

    Examples
    --------
    >>> import torch
    >>> from tvm_pesto.frontend import from_torch, symbolic_dims
    >>> symbolic_dims(from_torch(torch.nn.ReLU(), (torch.zeros(2, 3),)))
    []
    """
    f = mod[func]
    found = []
    for p in f.params:
        dims = _type_dynamic_dims(p.ty)
        if dims:
            found.append(("parameter", p.name, dims))
    body = f.body
    for block in getattr(body, "blocks", []):
        for b in block.bindings:
            dims = _type_dynamic_dims(b.var.ty)
            if dims:
                found.append(("binding", b.var.name, dims))
    return found


def check_static(mod: tvm.IRModule) -> None:
    """Raise if ``main`` has a symbolic or unknown shape in a parameter or binding.

    Parameters
    ----------
    mod : tvm.IRModule
        A module with a ``main`` function.

    Raises
    ------
    UnsupportedModuleError
        Naming the first variables with dynamic dimensions, and asking for a static export.

    Examples
    --------
    >>> from tvm import relax, tirx
    >>> from tvm_pesto.frontend import check_static
    >>> n = tirx.Var("n", "int64")
    >>> x = relax.Var("x", relax.TensorType([n, 4], "float32"))
    >>> bb = relax.BlockBuilder()
    >>> with bb.function("main", [x]):
    ...     _ = bb.emit_func_output(x)
    >>> dyn = bb.get()
    >>> from tvm_pesto.errors import UnsupportedModuleError
    >>> try:
    ...     check_static(dyn)
    ... except UnsupportedModuleError as err:
    ...     print(str(err).split(";")[0])
    main parameter 'x' has dynamic dimension(s) n
    """
    try:
        mod["main"]
    except Exception as exc:
        raise UnsupportedModuleError(
            "the module has no 'main' function; tvm-pesto places the function named 'main' "
            "(rename the entry function)") from exc
    found = symbolic_dims(mod, "main")
    if not found:
        return
    kind, var, dims = found[0]
    more = f"{len(found) - 1} more variable(s) are dynamic too; " if len(found) > 1 else ""
    raise UnsupportedModuleError(
        f"main {kind} {var!r} has dynamic dimension(s) {', '.join(dims)}; {more}"
        "tvm-pesto places static graphs only: export the model with static shapes "
        "(torch.export without dynamic_shapes, or ONNX with a fixed shape_dict)")
