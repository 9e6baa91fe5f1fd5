"""A model's forward pass for training: ``backbone(inputs, params, states)``.

``tvm.relax.training.SetupTrainer`` differentiates a function named ``backbone`` whose
parameters are the data inputs, then the trainable parameters, then the states, in a
module with attributes ``param_num`` and ``state_num``; it returns ``(output,
*new_states)``. :func:`make_backbone` builds it from a zoo model (or any PyTorch module)
exported in train mode and imported with its parameters as inputs
(:func:`tvm_pesto.frontend.from_exported_program` with ``keep_params_as_input=True``).

BatchNorm in train mode normalises with the batch statistics and updates its running mean
and variance; the importer emits ``relax.nn.batch_norm(..., training=True)`` with the
running statistics bound as constants. Here each such constant becomes a state (named like
the PyTorch buffer, e.g. ``stem.1.running_mean``) and results 1 and 2 of the batch norm
(the updated statistics) are returned as the new states, the variance rescaled to
PyTorch's update (which mixes in the unbiased batch variance; TVM's the biased one).
PyTorch's ``num_batches_tracked`` counter is not kept (its increment is dead code in the
step).

Examples
--------
>>> from tvm_pesto.train.backbone import make_backbone
>>> bb = make_backbone("resnet50")
>>> len(bb.param_names), bb.state_names[:2]
(53, ['stem.1.running_mean', 'stem.1.running_var'])
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relax

from ..errors import TrainingError, error_line
from ..frontend import from_exported_program
from ..graph.subgraph import Remap

__all__ = ["Backbone", "make_backbone"]


@dataclass
class Backbone:
    """What training needs from a model.

    Attributes
    ----------
    name : str
    mod : tvm.IRModule
        Function ``backbone(*inputs, *params, *states) -> (output, *new_states)`` (just
        ``output`` without states); attributes ``param_num``, ``state_num``.
    input_names : list of str
    param_names, state_names : list of str
        PyTorch names (``layers.0.ln1.weight``, ``stem.1.running_mean``).
    params, states : list of numpy.ndarray
        Initial values.
    inputs : tuple of numpy.ndarray
        One example batch (the zoo's seeded inputs).
    torch_model : torch.nn.Module or None
        A private copy of the PyTorch model in train mode (for the gradient check).
    """

    name: str
    mod: tvm.IRModule
    input_names: list
    param_names: list
    params: list
    state_names: list = field(default_factory=list)
    states: list = field(default_factory=list)
    inputs: tuple = ()
    torch_model: object = None

    @property
    def func(self) -> relax.Function:
        return self.mod["backbone"]

    @property
    def output_type(self) -> relax.TensorType:
        """The type of the model's output (the loss's first argument)."""
        ty = self.func.ret_ty
        return ty.fields[0] if self.states else ty


def _is_training_bn(call) -> bool:
    return (isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.nn.batch_norm"
            and bool(call.attrs.training))


def _unbiased_running_var(bb: relax.BlockBuilder, call, result, name: str) -> relax.Var:
    """The running variance as PyTorch updates it. TVM's batch norm mixes in the biased
    batch variance ``v`` (over ``n`` values per channel): ``r' = (1-m)·r + m·v``; PyTorch the
    unbiased one, ``n/(n-1)·v``, which is ``r'·n/(n-1) - r·(1-m)/(n-1)``."""
    shape = [int(d) for d in call.args[0].ty.shape.values]
    axis = int(call.attrs.axis) % len(shape)
    n = int(np.prod([d for k, d in enumerate(shape) if k != axis]))
    new = bb.emit(relax.TupleGetItem(result, 2), name_hint=name)
    if n < 2:
        return new
    m = float(call.attrs.momentum)
    dtype = str(new.ty.dtype)
    scaled = relax.op.multiply(new, relax.const(n / (n - 1), dtype))
    old = relax.op.multiply(call.args[4], relax.const((1 - m) / (n - 1), dtype))
    return bb.emit(relax.op.subtract(scaled, old), name_hint=name)


def _with_states(func: relax.Function, param_target: dict) -> tuple[relax.Function, list, list]:
    """``func`` with the running statistics of its training batch norms as parameters
    (after the others) and their updates returned after the output."""
    old_params = list(func.params)
    new_params = [relax.Var(p.name, p.ty) for p in old_params]
    var_map = dict(zip(old_params, new_params))
    states, names, values, updates = [], [], [], []
    blocks = func.body.blocks

    def state_var(const, name):
        v = relax.Var(name.replace(".", "_"), const.ty)
        states.append(v)
        names.append(name)
        values.append(const.value.numpy())
        return v

    state_slots = []  # batch-norm results whose items 1 and 2 are new states
    emitted = []  # the bindings (batch norms with state parameters), emitted once the parameters are known
    for block in blocks:
        for b in block.bindings:
            val = b.value
            if _is_training_bn(val) and all(isinstance(a, tvm.ir.Constant) for a in val.args[3:5]):
                weight = b.value.args[1]
                module = param_target.get(weight.name, "").rsplit(".", 1)[0] if isinstance(weight, relax.Var) else ""
                module = module or f"batch_norm{len(state_slots)}"
                mean = state_var(val.args[3], f"{module}.running_mean")
                var = state_var(val.args[4], f"{module}.running_var")
                val = relax.Call(val.op, [*val.args[:3], mean, var], val.attrs)
                state_slots.append(b.var)
            emitted.append((b.var, val))
    params = new_params + states
    bb = relax.BlockBuilder()
    with bb.function("backbone", params):
        with bb.dataflow():
            for var, val in emitted:
                call = Remap(var_map).visit_expr(val)
                var_map[var] = bb.emit(call, name_hint=var.name)
                if var in state_slots:
                    updates.append(bb.emit(relax.TupleGetItem(var_map[var], 1), name_hint=f"{var.name}_mean"))
                    updates.append(_unbiased_running_var(bb, call, var_map[var], f"{var.name}_var"))
            out = bb.emit_output(Remap(var_map).visit_expr(func.body.body))
            updates = [bb.emit_output(u) for u in updates]
        # SetupTrainer wants a tuple expression (not a variable) when there are states
        bb.emit_func_output(relax.Tuple([out, *updates]) if updates else out)
    return bb.get()["backbone"], names, values


def _import(model, inputs: tuple, name: str):
    """Export ``model`` in train mode and import it with its parameters as inputs."""
    import torch

    args = tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in inputs)
    try:
        ep = torch.export.export(model.train(), args)
    except Exception as exc:  # torch raises many types here
        raise TrainingError(f"torch.export failed for {name!r} in train mode: {error_line(exc)}; make the "
                            "model exportable in train mode (no data-dependent control flow)") from exc
    mod = from_exported_program(ep, name, keep_params_as_input=True)
    target = {s.arg.name: s.target for s in ep.graph_signature.input_specs}
    return mod, target, ep


def from_torch_model(model, inputs: tuple, name: str | None = None) -> Backbone:
    """The backbone of a PyTorch module (copied; the original is left as it is).

    Raises
    ------
    TrainingError
        When the model has no trainable parameter, or cannot be exported in train mode.
    """
    name = name or type(model).__name__
    inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    if not any(p.requires_grad for p in model.parameters()):
        raise TrainingError(f"model {name!r} has no trainable parameter, so there is nothing to train; give a "
                            "model with parameters (requires_grad=True), e.g. a zoo model")
    model = copy.deepcopy(model).train()
    mod, target, ep = _import(model, inputs, name)
    main = mod["main"]
    n_in = int(main.attrs["num_input"])
    func, state_names, states = _with_states(main, target)
    state_dict = ep.state_dict
    param_vars = list(main.params[n_in:])
    param_names = [target[p.name] for p in param_vars]
    params = [state_dict[t].detach().numpy().copy() for t in param_names]
    bmod = tvm.IRModule({"backbone": func}).with_attrs({"param_num": len(params), "state_num": len(states)})
    return Backbone(name, bmod, [p.name for p in main.params[:n_in]], param_names, params, state_names, states,
                    inputs, model)


def make_backbone(model, size: str = "small", batch: int | None = None) -> Backbone:
    """The backbone of a zoo model (name or :class:`~tvm_pesto.zoo.ZooModel`) or of a
    ``(torch_module, example_inputs)`` pair.

    Parameters
    ----------
    model : str, ZooModel or tuple
    size : {"small", "full"}
        Preset of a zoo model named by string.
    batch : int, optional
        Batch size (default: the zoo's example batch); other sizes get seeded N(0, 1) inputs.

    Raises
    ------
    GraphError
        For an unknown zoo name or size.
    TrainingError
        For a model without trainable parameters.
    """
    # lazy: the zoo loads PyTorch's models, which only a zoo model name needs
    from .. import zoo

    if isinstance(model, str):
        model = zoo.load(model, size)  # checks the name and size
    if isinstance(model, zoo.ZooModel):
        torch_model, inputs, name = model.torch_model, model.example_inputs, f"{model.name}/{model.size}"
    elif isinstance(model, tuple) and len(model) == 2:
        torch_model, inputs = model
        name = type(torch_model).__name__
        inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    else:
        raise TrainingError(f"cannot train a {type(model).__name__}; give a zoo model name "
                            f"({', '.join(zoo.list_models())}), a ZooModel or a (torch.nn.Module, example_inputs) "
                            "pair")
    if batch is not None:
        if batch < 1:
            raise TrainingError(f"batch must be >= 1, not {batch}")
        rng = np.random.default_rng(0)
        inputs = tuple(rng.standard_normal((batch,) + tuple(a.shape[1:])).astype(a.dtype) for a in inputs)
    return from_torch_model(torch_model, inputs, name)
