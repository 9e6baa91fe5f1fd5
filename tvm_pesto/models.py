"""Turn what the user typed (a zoo name or a model file) into a static Relax module and inputs.

:func:`load_model` is the one place the CLI and the Python API resolve a model. It accepts

- a zoo name (:func:`tvm_pesto.zoo.list_models`), loaded with :func:`tvm_pesto.zoo.load`
  (its seeded example inputs are kept);
- ``FILE.onnx``: read with ONNX and imported with :func:`tvm_pesto.frontend.from_onnx`;
  dynamic axes are set through the importer's ``shape_dict``;
- ``FILE.pt2``: a program saved with :func:`torch.export.save`, read with
  :func:`torch.export.load` and imported with :func:`tvm_pesto.frontend.from_exported_program`
  (the same path as the zoo's PyTorch models);
- ``FILE.py`` (or ``FILE.py:NAME``): a Python file that defines a Relax ``IRModule``, e.g. an
  ``@I.ir_module`` class, or the text ``mod.script()`` prints saved as ``.py``. The file is
  run as Python with :func:`runpy.run_path` in a fresh namespace that already holds ``tvm``,
  ``I``, ``R`` and ``T`` (the printed text has its import lines commented out); running it,
  rather than parsing it, is what lets the file import, compute and decorate as Python does.
  ``NAME`` picks one module when the file defines several;
- ``FILE.tvmscript`` or ``FILE.relax``: the text ``mod.script()`` prints (``show_meta=True``
  keeps the weights), parsed with :func:`tvm.script.from_source` without running any code.

Inputs whose shapes are dynamic get a static shape from ``input_shapes`` (the CLI's
``--input-shape NAME=D1,D2,...``): ONNX through the importer, ``.pt2`` and TVMScript by
binding the symbolic variables with :class:`tvm.relax.transform.BindSymbolicVars`. Only
dynamic axes can be set; fixed axes must keep their value. The module returned passes
:func:`tvm_pesto.frontend.check_static`.

Example inputs for files are seeded random arrays of the input shapes: floating-point
inputs ~ N(0, 1), integer inputs (token ids, indices) uniform in
:data:`~tvm_pesto.frontend.INT_INPUT_RANGE` (valid for any vocabulary or axis of size >= 2),
booleans uniform.

Errors: :class:`~tvm_pesto.errors.GraphError` for what was typed (an unknown name, a missing
file, an unknown suffix, a malformed or mismatched input shape);
:class:`~tvm_pesto.errors.UnsupportedModuleError` for what the file holds (a corrupt file, an
operator the importer does not support, a shape that stays dynamic). Each names the file.

Examples
--------
>>> from tvm_pesto.models import load_model, parse_input_shapes
>>> m = load_model("mlp_mixer")
>>> m.source, m.input_names, m.example_inputs[0].shape
('zoo', ['x'], (1, 3, 96, 96))
>>> parse_input_shapes(["x=1,3,224,224"])
{'x': (1, 3, 224, 224)}
"""
from __future__ import annotations

import contextlib
import logging
import os
import re
import runpy
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import numpy as np
import tvm
from tvm import relax

from .errors import GraphError, UnsupportedModuleError
from .frontend import INT_INPUT_RANGE, check_static, error_line, from_exported_program, from_onnx, read_onnx

__all__ = ["SUFFIXES", "LoadedModel", "load_model", "parse_input_shapes", "random_inputs"]

#: File suffix -> ``LoadedModel.source``.
SUFFIXES = {".onnx": "onnx", ".pt2": "pt2", ".py": "tvmscript", ".tvmscript": "tvmscript", ".relax": "tvmscript"}

_SHAPE_FORM = "NAME=D1,D2,... with positive integer dimensions, e.g. x=1,3,224,224"


@dataclass(frozen=True)
class LoadedModel:
    """A model ready to place: a static Relax module and one input per parameter of ``main``.

    Attributes
    ----------
    name : str
        The zoo name, or the file name without its suffix.
    mod : tvm.IRModule
        Static shapes, weights as constants.
    example_inputs : tuple of numpy.ndarray
        One array per parameter of ``main``, in order.
    source : {"zoo", "onnx", "pt2", "tvmscript"}
        Where the model came from.
    path : str or None
        The file read (None for a zoo model).
    """

    name: str
    mod: tvm.IRModule
    example_inputs: tuple
    source: str
    path: str | None = None

    @property
    def input_names(self) -> list[str]:
        """Names of the parameters of ``main``."""
        return [p.name for p in self.mod["main"].params]


def parse_input_shapes(specs: Iterable[str] | None) -> dict[str, tuple[int, ...]]:
    """Parse ``--input-shape`` values ``NAME=D1,D2,...`` into ``{NAME: (D1, D2, ...)}``.

    Parameters
    ----------
    specs : iterable of str, optional
        One string per input; the name is everything before the last ``=``.

    Returns
    -------
    dict of str to tuple of int

    Raises
    ------
    GraphError
        For a malformed string or a name given twice; the message shows the expected form.

    Examples
    --------
    >>> from tvm_pesto.models import parse_input_shapes
    >>> parse_input_shapes(["x=1,3,32,32", "ids = 1, 16"])
    {'x': (1, 3, 32, 32), 'ids': (1, 16)}
    """
    shapes: dict[str, tuple[int, ...]] = {}
    for spec in specs or ():
        name, eq, dims = str(spec).rpartition("=")
        name = name.strip()
        try:
            shape = tuple(int(d) for d in dims.split(","))
        except ValueError:
            shape = ()
        if not eq or not name or not shape or min(shape) <= 0:
            raise GraphError(f"malformed --input-shape {spec!r}; expected {_SHAPE_FORM}")
        if name in shapes:
            raise GraphError(f"--input-shape gives input {name!r} twice ({shapes[name]} and {shape}); give it once")
        shapes[name] = shape
    return shapes


def load_model(target: str | os.PathLike, size: str = "small",
               input_shapes: Mapping[str, Sequence[int]] | None = None, seed: int = 0) -> LoadedModel:
    """Load a zoo model or a model file as a static Relax module with example inputs.

    Parameters
    ----------
    target : str or os.PathLike
        A zoo name, or a ``.onnx``, ``.pt2``, ``.py`` (optionally ``FILE.py:NAME``),
        ``.tvmscript`` or ``.relax`` file (see the module docstring).
    size : {"small", "full"}
        Zoo preset; ignored for files.
    input_shapes : mapping of str to sequence of int, optional
        Static shapes for inputs with dynamic axes (see :func:`parse_input_shapes`). Each
        name must be an input of the model, and axes fixed in the model must match.
    seed : int
        Seed of the random inputs of a file (a zoo model keeps its own inputs).

    Returns
    -------
    LoadedModel

    Raises
    ------
    GraphError
        Unknown zoo name that is not a file (the message lists the zoo names and the
        suffixes), missing file, unknown suffix, or an input shape that names no input,
        has the wrong rank or changes a fixed axis.
    UnsupportedModuleError
        Corrupt file (the message names it and quotes the parser's first line), an operator
        the importer does not support (named), a shape that stays dynamic (the message names
        the input and axis and shows the ``--input-shape`` to add).

    Examples
    --------
    >>> from tvm_pesto.models import load_model
    >>> load_model("bert").example_inputs[0].shape
    (1, 64, 64)
    """
    text = os.fspath(target)
    path, member = _split_member(text)
    suffix = os.path.splitext(path)[1].lower()
    shapes = {str(k): tuple(int(d) for d in v) for k, v in (input_shapes or {}).items()}
    if suffix not in SUFFIXES:
        return _load_zoo(text, size, shapes, suffix)
    if not os.path.isfile(path):
        raise GraphError(f"model file {path!r} does not exist (working directory {os.getcwd()!r}); "
                         "check the path")
    source = SUFFIXES[suffix]
    mod, file_names = _import_file(path, member, suffix, shapes)
    _require_static(mod, path, source, file_names)
    name = os.path.splitext(os.path.basename(path))[0]
    return LoadedModel(name, mod, random_inputs(mod, seed, path), source, path)


def _load_zoo(text: str, size: str, shapes: dict[str, tuple], suffix: str) -> LoadedModel:
    """A zoo model, or the error for a target that is neither a zoo name nor a known file type."""
    # lazy: the zoo loads PyTorch, which only a zoo model name needs
    from . import zoo

    if text in zoo.MODELS:
        zm = zoo.load(text, size)
        mod = _set_input_shapes(zm.mod, shapes, f"zoo model {text!r}",
                                fixed_hint="zoo models have fixed shapes; choose them with --size")
        return LoadedModel(text, mod, tuple(zm.example_inputs), "zoo")
    if os.path.exists(text):
        raise GraphError(f"model file {text!r} has an unknown suffix {suffix or '(none)'!r}; "
                         f"use one of {', '.join(SUFFIXES)}")
    raise GraphError(f"{text!r} is neither a zoo model nor a model file; give a zoo name "
                     f"({', '.join(zoo.list_models())}) or the path of a file ending in "
                     f"{', '.join(SUFFIXES)}")


def _import_file(path: str, member: str | None, suffix: str,
                 shapes: dict[str, tuple]) -> tuple[tvm.IRModule, dict[str, str]]:
    """The file's module with ``shapes`` applied, and parameter name -> input name in the file
    for the inputs the importer renamed."""
    if SUFFIXES[suffix] == "onnx":
        model = read_onnx(path)
        declared = _onnx_input_dims(model)
        _check_input_shapes(declared, shapes, path)
        mod = from_onnx(model, shape_dict=shapes or None, name=path)
        # the importer renames inputs that are not identifiers (input.1 -> input_1), in order
        params = mod["main"].params
        return mod, (dict(zip((p.name for p in params), declared)) if len(params) == len(declared) else {})
    if SUFFIXES[suffix] == "pt2":
        mod = from_exported_program(_read_pt2(path), path)
    elif suffix == ".py":
        mod = _run_python_module(path, member)
    else:
        mod = _parse_tvmscript(path)
    return _set_input_shapes(mod, shapes, path), {}


def random_inputs(mod: tvm.IRModule, seed: int = 0, label: str = "the module") -> tuple[np.ndarray, ...]:
    """Seeded random arrays for the parameters of ``main``, in order.

    Floating-point tensors ~ N(0, 1), integer tensors uniform in :data:`~tvm_pesto.frontend.INT_INPUT_RANGE`,
    booleans uniform; one generator seeded with ``seed`` draws them in parameter order.

    Parameters
    ----------
    mod : tvm.IRModule
        A module whose ``main`` takes tensors of static shape.
    seed : int
        Generator seed.
    label : str
        Name used in error messages.

    Returns
    -------
    tuple of numpy.ndarray

    Raises
    ------
    UnsupportedModuleError
        For a parameter that is not a static tensor or whose dtype numpy lacks.
    """
    rng = np.random.default_rng(seed)
    out = []
    for p in mod["main"].params:
        dims = _param_dims(p)
        if dims is None or not all(isinstance(d, int) for d in dims):
            raise UnsupportedModuleError(
                f"parameter {p.name!r} of main in {label} is {p.ty}, not a tensor of static shape; "
                "tvm-pesto feeds tensors of static shape (give the shape with --input-shape)")
        dtype = str(p.ty.dtype.dtype)
        try:
            np_dtype = np.dtype(dtype)
        except TypeError:
            raise UnsupportedModuleError(
                f"parameter {p.name!r} of main in {label} has dtype {dtype}, which numpy cannot hold; "
                "cast the input to a numpy dtype (e.g. float32) in the model") from None
        if np_dtype.kind == "f":
            x = rng.standard_normal(dims).astype(np_dtype)
        elif np_dtype.kind in "iu":
            x = rng.integers(*INT_INPUT_RANGE, size=dims).astype(np_dtype)
        elif np_dtype.kind == "b":
            x = rng.random(dims) < 0.5
        else:
            raise UnsupportedModuleError(
                f"parameter {p.name!r} of main in {label} has dtype {dtype}; tvm-pesto generates "
                "float, integer and boolean inputs only")
        out.append(np.ascontiguousarray(x))
    return tuple(out)


# ---------------------------------------------------------------------------------------
# reading files


def _split_member(text: str) -> tuple[str, str | None]:
    """``FILE.py:NAME`` -> (``FILE.py``, ``NAME``); anything else -> (text, None)."""
    head, colon, tail = text.rpartition(":")
    if colon and head.lower().endswith(".py") and tail.isidentifier() and not os.path.exists(text):
        return head, tail
    return text, None


@contextlib.contextmanager
def _quiet(logger: str):
    """Silence a logger that prints a traceback before raising (torch.export.load does)."""
    log = logging.getLogger(logger)
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


def _read_pt2(path: str):
    import torch

    try:
        with _quiet("torch.export"), _quiet("torch.export.pt2_archive._package"):
            return torch.export.load(path)
    except Exception as exc:
        raise UnsupportedModuleError(
            f"cannot read torch.export program {path!r}: {error_line(exc)}. "
            "Pass a file written by torch.export.save(torch.export.export(model, args), path)") from exc


def _script_globals() -> dict:
    from tvm.script import ir as I  # noqa: N812 (TVMScript's own names)
    from tvm.script import relax as R  # noqa: N812
    from tvm.script import tirx as T  # noqa: N812

    return {"tvm": tvm, "I": I, "R": R, "T": T}


def _script_error(exc: BaseException) -> str:
    """The parser's first line, with the line number the TVMScript diagnostic points at."""
    text = error_line(exc)
    where = re.search(r"-->\s*\S*?:(\d+):\d+", str(exc))
    return f"{text} (line {where.group(1)})" if where else text


def _run_python_module(path: str, member: str | None) -> tvm.IRModule:
    try:
        namespace = runpy.run_path(path, init_globals=_script_globals(), run_name="__tvm_pesto_model__")
    except Exception as exc:
        raise UnsupportedModuleError(
            f"running {path!r} to get its Relax module failed: {_script_error(exc)}. "
            "The .py file must run as Python and define an IRModule (e.g. an @I.ir_module class "
            "or the text mod.script() prints)") from exc
    modules = {k: v for k, v in namespace.items() if isinstance(v, tvm.IRModule) and not k.startswith("_")}
    if member is not None:
        if member not in modules:
            raise GraphError(f"{path!r} defines no IRModule named {member!r}; "
                             f"its IRModules: {', '.join(sorted(modules)) or 'none'}")
        return modules[member]
    if len(modules) == 1:
        return next(iter(modules.values()))
    if not modules:
        raise UnsupportedModuleError(
            f"{path!r} defines no Relax IRModule at top level; define one (an @I.ir_module class "
            "or a variable holding a tvm.IRModule)")
    names = sorted(modules)
    raise GraphError(f"{path!r} defines several IRModules ({', '.join(names)}); pick one as "
                     f"{path}:{names[0]}")


def _parse_tvmscript(path: str) -> tvm.IRModule:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        mod = tvm.script.from_source(text)
    except Exception as exc:
        raise UnsupportedModuleError(
            f"cannot parse TVMScript file {path!r}: {_script_error(exc)}. A .tvmscript/.relax "
            "file holds the text mod.script(show_meta=True) prints; a Python file that imports or "
            "builds the module should end in .py") from exc
    if not isinstance(mod, tvm.IRModule):
        raise UnsupportedModuleError(
            f"TVMScript file {path!r} holds a {type(mod).__name__}, not an IRModule; save mod.script() "
            "of the whole module (@I.ir_module with a main function)")
    return mod


# ---------------------------------------------------------------------------------------
# input shapes


def _onnx_input_dims(model) -> dict[str, list | None]:
    """Graph inputs (initializers excluded) -> dims: int when fixed, the name (or "?") when dynamic;
    None for an input without a shape."""
    initializers = {t.name for t in model.graph.initializer}
    dims: dict[str, list | None] = {}
    for inp in model.graph.input:
        if inp.name in initializers:
            continue
        tt = inp.type.tensor_type
        if not tt.HasField("shape"):
            dims[inp.name] = None
            continue
        dims[inp.name] = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tt.shape.dim]
    return dims


def _param_dims(p: relax.Var) -> list | None:
    """dims of a tensor parameter: int when fixed, the PrimExpr when symbolic; None without a shape."""
    ty = p.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    return [int(v.value) if isinstance(v, tvm.tirx.IntImm) else v for v in ty.shape.values]


def _fmt_shape(dims) -> str:
    return "(" + ", ".join(str(d) for d in dims) + ")" if dims is not None else "(unknown shape)"


def _relax_input_dims(mod: tvm.IRModule) -> dict[str, list | None]:
    return {p.name: _param_dims(p) for p in mod["main"].params}


def _check_input_shapes(declared: dict[str, list | None], shapes: dict[str, tuple], label: str,
                        fixed_hint: str = "re-export the model with axis {axis} dynamic") -> None:
    """Every name is an input, every rank matches, every fixed axis keeps its value."""
    for name, shape in shapes.items():
        if name not in declared:
            listing = ", ".join(f"{n} {_fmt_shape(d)}" for n, d in declared.items()) or "none"
            raise GraphError(f"--input-shape names {name!r}, which is not an input of {label}; "
                             f"its inputs are: {listing}")
        dims = declared[name]
        if dims is None:
            continue
        if len(dims) != len(shape):
            raise GraphError(f"--input-shape {name}={','.join(map(str, shape))} has rank {len(shape)}, but "
                             f"input {name!r} of {label} has shape {_fmt_shape(dims)} (rank {len(dims)}); "
                             f"give {len(dims)} dimensions")
        for axis, (d, v) in enumerate(zip(dims, shape)):
            if isinstance(d, int) and d != v:
                raise GraphError(
                    f"--input-shape {name}={','.join(map(str, shape))} sets axis {axis} to {v}, but input "
                    f"{name!r} of {label} has shape {_fmt_shape(dims)} and axis {axis} is fixed at {d}; only "
                    f"dynamic axes can be set ({fixed_hint.format(axis=axis)})")


def _set_input_shapes(mod: tvm.IRModule, shapes: dict[str, tuple], label: str, **hint: str) -> tvm.IRModule:
    """Bind the symbolic variables of ``main``'s parameters to the values ``shapes`` gives them."""
    if not shapes:
        return mod
    _check_input_shapes(_relax_input_dims(mod), shapes, label, **hint)
    func = mod["main"]
    values: dict[str, int] = {}
    for p in func.params:
        dims = _param_dims(p)
        if p.name not in shapes or dims is None:
            continue
        for d, v in zip(dims, shapes[p.name]):
            if isinstance(d, tvm.tirx.Var):
                if values.setdefault(d.name, v) != v:
                    raise GraphError(f"--input-shape gives {d.name} (shared by several inputs of {label}) "
                                     f"the values {values[d.name]} and {v}; give it one value")
    attrs = func.attrs or {}
    low, high = attrs.get("tir_var_lower_bound", {}), attrs.get("tir_var_upper_bound", {})
    for var, v in values.items():
        if (var in low and v < int(low[var])) or (var in high and v > int(high[var])):
            raise GraphError(f"--input-shape sets {var} to {v}, outside the range [{low.get(var, '-inf')}, "
                             f"{high.get(var, 'inf')}] {label} was exported for; choose a value in it")
    if values:
        mod = relax.transform.BindSymbolicVars(values, func_name="main")(mod)
    for p in mod["main"].params:
        if p.name in shapes and _param_dims(p) != list(shapes[p.name]):
            raise GraphError(f"input {p.name!r} of {label} has shape {_fmt_shape(_param_dims(p))} after "
                             f"binding --input-shape {p.name}={','.join(map(str, shapes[p.name]))}: an axis is an "
                             "expression, not a variable; set the inputs that define its variables instead")
    return mod


def _require_static(mod: tvm.IRModule, label: str, source: str, file_names: Mapping[str, str]) -> None:
    """Raise, naming the input and axis and the ``--input-shape`` to add, if a parameter of
    ``main`` is dynamic; then :func:`check_static` for the bindings. ``file_names`` maps a
    parameter to the input's name in the file where the importer renamed it."""
    try:
        params = mod["main"].params
    except Exception:
        params = []  # check_static explains the missing main
    for p in params:
        dims = _param_dims(p)
        if dims is not None and all(isinstance(d, int) for d in dims):
            continue
        name = file_names.get(p.name, p.name)
        if dims is None:
            hint = (f"give its shape with --input-shape {name}=D1,D2,..." if source == "onnx" else
                    "annotate its shape in the model (e.g. R.Tensor((1, 3, 224, 224), \"float32\"))")
            raise UnsupportedModuleError(f"input {name!r} of {label} is {p.ty}, without a static shape; {hint}")
        axes = ", ".join(f"axis {i} is {str(d)!r}" for i, d in enumerate(dims) if not isinstance(d, int))
        example = tuple(d if isinstance(d, int) else 1 for d in dims)
        raise UnsupportedModuleError(
            f"input {name!r} of {label} has dynamic shape {_fmt_shape(dims)} ({axes}); tvm-pesto places "
            f"static graphs: give its shape with --input-shape {name}={','.join(map(str, example))} "
            f"(input_shapes={{{name!r}: {example}}} in Python), with the sizes you want")
    try:
        check_static(mod)
    except UnsupportedModuleError as exc:
        raise UnsupportedModuleError(f"{label}: {exc}") from exc
