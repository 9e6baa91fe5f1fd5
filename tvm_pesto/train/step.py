"""One Relax function for a whole training step: forward, loss, backward, update.

:func:`make_step` runs ``tvm.relax.training.SetupTrainer`` on a :class:`Backbone` (which
appends the loss, decomposes batch and layer norm for training, differentiates with
``relax.transform.Gradient`` and adds the optimizer function), then emits the bodies of
its ``backbone_loss_adjoint`` and ``optimizer`` functions into one ``main`` with a
BlockBuilder, so the op graph sees every operator of the step::

    main(*inputs, targets, *params, *states, *optim_states)
        -> (loss, *new_params, *new_states, *new_optim_states)

``num_input`` is the number of data inputs (inputs and targets); everything after them is
*carried*: output ``1 + k`` is the next value of input ``num_input + k``
(:attr:`TrainStep.carry`), which the runtime keeps on its device between steps
(:meth:`tvm_pesto.run.runtime.PlacedRuntime.step`).

While emitting, each operator binding of ``main`` is recorded with its role
(:attr:`TrainStep.roles`): ``forward`` (model and loss), ``backward`` (gradient) with the
forward binding it differentiates (:attr:`TrainStep.grad_of`), or ``update`` (optimizer)
with the parameter it updates (:attr:`TrainStep.update_of`). The placement constraints
(:mod:`tvm_pesto.train.constraints`) are made from these.

Which forward operator a gradient operator belongs to follows the Gradient pass's
structure: it visits the forward bindings in reverse and, at each one ("its turn"), emits
the partial adjoints of that binding's arguments, each named ``<argument>_adjoint`` (with
a number when the name repeats), after the intermediate bindings they need. So a named
binding closes a run of backward bindings that belong to a forward binding reading the
named argument; turns only go backwards, so the owner is the latest such reader at or
before the previous turn.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relax

from ..errors import TrainingError
from ..graph.subgraph import Remap
from .backbone import Backbone
from .choices import LossChoice
from .gradients import missing_gradients

__all__ = ["TrainStep", "make_step"]

#: How the Gradient pass names an adjoint: ``<var>_adjoint`` plus a number when repeated.
_ADJOINT = re.compile(r"^(.*)_adjoint\d*$")


@dataclass
class TrainStep:
    """A training step as one Relax function, with where each operator came from.

    Attributes
    ----------
    mod : tvm.IRModule
        ``main`` as in the module docstring (attribute ``num_input``).
    trainer : tvm.IRModule
        SetupTrainer's module (``backbone_loss_adjoint``, ``optimizer``), not legalized.
    backbone : Backbone
    loss : LossChoice
    optimizer : tvm.relax.training.optimizer.Optimizer
    num_input : int
        Data inputs of ``main`` (model inputs, then the targets).
    carried_names : list of str
        Names of the carried inputs: parameters, states, optimizer states.
    carried_init : list of numpy.ndarray
        Their initial values.
    roles : dict
        Binding index of ``main`` (over all its blocks) -> ``forward``, ``backward`` or ``update``.
    grad_of : dict
        Backward binding index -> the forward binding index it belongs to.
    update_of : dict
        Update binding index -> the parameter index it updates (bindings shared by all
        parameters, e.g. Adam's step count, are left out).
    """

    mod: tvm.IRModule
    trainer: tvm.IRModule
    backbone: Backbone
    loss: LossChoice
    optimizer: object
    num_input: int
    carried_names: list
    carried_init: list
    roles: dict = field(default_factory=dict)
    grad_of: dict = field(default_factory=dict)
    update_of: dict = field(default_factory=dict)

    @property
    def num_params(self) -> int:
        return len(self.backbone.params)

    @property
    def num_states(self) -> int:
        return len(self.backbone.states)

    @property
    def carry(self) -> list[tuple[int, int]]:
        """``(output index, input index)``: output ``1 + k`` is the next value of input
        ``num_input + k``."""
        return [(1 + k, self.num_input + k) for k in range(len(self.carried_names))]


def _bindings(func: relax.Function) -> list:
    return [b for block in func.body.blocks for b in block.bindings]


def _is_call(value) -> bool:
    return isinstance(value, relax.Call)


def _operands(value) -> list:
    """The variables a binding's value takes, one per occurrence (the Gradient pass emits
    one partial adjoint per occurrence)."""
    if isinstance(value, relax.Var):
        return [value]
    if isinstance(value, relax.TupleGetItem):
        return _operands(value.tuple_value)
    items = value.fields if isinstance(value, relax.Tuple) else getattr(value, "args", [])
    return [v for a in items for v in _operands(a)]


def _first_backward(bindings) -> int:
    """Index of the Gradient pass's seed (``<target>_adjoint = ones``): backward starts there."""
    for i, b in enumerate(bindings):
        if _ADJOINT.match(b.var.name):
            return i
    raise TrainingError("the Gradient pass produced no adjoint bindings; the loss does not depend on any "
                        "trainable parameter (check that the model's output uses its parameters)")


def gradient_owners(bindings, first_backward: int) -> dict[int, int]:
    """Backward binding index -> index of the forward binding whose turn emitted it (see
    the module docstring); backward bindings with no reader to attach to are left out."""
    readers: dict[str, list[int]] = {}  # name -> forward bindings reading a variable of that name
    producers: dict[str, list[int]] = {}
    arg_count: dict[tuple[int, str], int] = {}
    for i in range(first_backward):
        producers.setdefault(bindings[i].var.name, []).append(i)
        for v in relax.analysis.free_vars(bindings[i].value):
            if i not in readers.setdefault(v.name, []):
                readers[v.name].append(i)
        for a in _operands(bindings[i].value):
            arg_count[(i, a.name)] = arg_count.get((i, a.name), 0) + 1
    owner: dict[int, int] = {}
    cursor, used = first_backward, {}  # the current turn, and partials it emitted per argument name
    pending: list[int] = []
    for j in range(first_backward, len(bindings)):
        pending.append(j)
        m = _ADJOINT.match(bindings[j].var.name)
        if not m:
            continue
        base = m.group(1)
        room = used.get(base, 0) < arg_count.get((cursor, base), 0)
        cands = [] if j == first_backward else [
            i for i in readers.get(base, []) if i < cursor or (i == cursor and room)]
        if not cands:  # the seed (the target's turn comes first), or an argument read at no earlier turn
            cands = [i for i in producers.get(base, []) if i < cursor]
        if cands:
            turn = max(cands)
            if turn != cursor:
                cursor, used = turn, {}
            used[base] = used.get(base, 0) + 1
            for p in pending:
                owner[p] = cursor
        pending = []
    for p in pending:  # trailing intermediates: the last turn
        owner[p] = cursor
    # the turn of an alias or tuple item is that of the call it stands for
    producer = {bindings[i].var: i for i in range(first_backward)}

    def call_of(i):
        for _ in range(first_backward):
            v = bindings[i].value
            if _is_call(v):
                return i
            nxt = v
            if isinstance(v, relax.TupleGetItem):
                nxt = v.tuple_value
                made = bindings[producer[nxt]].value if nxt in producer else None
                if isinstance(made, relax.Tuple):
                    nxt = made.fields[v.index]
            elif isinstance(v, relax.Tuple):  # a tuple stands for its first field (batch norm's output)
                nxt = v.fields[0] if len(v.fields) else None
            if not isinstance(nxt, relax.Var) or nxt not in producer:
                return None
            i = producer[nxt]
        return None

    out = {}
    for j, i in owner.items():
        c = call_of(i) if i < first_backward else None
        if c is not None:
            out[j] = c
    return out


def _update_owners(func: relax.Function) -> dict[int, int]:
    """Optimizer binding index -> parameter index, by dataflow: a binding belongs to the one
    parameter all the new values it feeds belong to (or, feeding none, the one parameter or
    gradient it reads); bindings shared by several parameters are left out."""
    bindings = _bindings(func)
    params, grads = _tuple_items(func, 0), _tuple_items(func, 1)
    results = set(_leaves(func.body.body, {b.var: b.value for b in bindings}))
    index = {b.var: k for k, b in enumerate(bindings)}
    reads: list[set] = []  # parameter indices each binding depends on through params/grads
    seed = {}
    for k, (p, g) in enumerate(zip(params, grads)):
        seed[p] = {k}
        seed[g] = {k}
    for b in bindings:
        dep = set()
        for v in relax.analysis.free_vars(b.value):
            dep |= seed.get(v, set()) | (reads[index[v]] if v in index else set())
        reads.append(dep)
    feeds: list[set] = [set() for _ in bindings]
    for k in range(len(bindings) - 1, -1, -1):
        if bindings[k].var in results and len(reads[k]) == 1:
            feeds[k] |= reads[k]  # a new parameter or per-parameter state
        for v in relax.analysis.free_vars(bindings[k].value):
            if v in index:
                feeds[index[v]] |= feeds[k]
    out = {}
    for k in range(len(bindings)):
        own = feeds[k] if feeds[k] else reads[k]
        if len(own) == 1:
            out[k] = next(iter(own))
    return out


class _Emitter:
    """Emit a function's bindings into the enclosing BlockBuilder function, inlined:
    tuples and tuple items of known tuples are resolved in Python, calls are emitted."""

    def __init__(self, bb: relax.BlockBuilder):
        self.bb = bb

    def resolve(self, expr, env):
        if isinstance(expr, relax.Var):
            return env.get(expr, expr)
        if isinstance(expr, relax.Tuple):
            return tuple(self.resolve(f, env) for f in expr.fields)
        if isinstance(expr, relax.TupleGetItem):
            tup = self.resolve(expr.tuple_value, env)
            if isinstance(tup, tuple):
                return tup[expr.index]
        return None

    def emit(self, func: relax.Function, args, calls: dict):
        """Inline ``func(*args)``; ``calls`` gets, for each call binding ``k`` of ``func``,
        the variable of main it became. Returns the result (Python tuples for Relax tuples)."""
        env = dict(zip(func.params, args))

        def as_expr(v):
            return relax.Tuple([as_expr(x) for x in v]) if isinstance(v, tuple) else v

        for k, b in enumerate(_bindings(func)):
            val = b.value
            known = None if _is_call(val) else self.resolve(val, env)
            if known is not None:
                env[b.var] = known
                continue
            remap = {v: as_expr(env[v]) for v in relax.analysis.free_vars(val) if v in env}
            env[b.var] = self.bb.emit(Remap(remap).visit_expr(val), name_hint=b.var.name)
            if _is_call(val):
                calls[k] = env[b.var]
        return self.resolve(func.body.body, env)


def _optim_state_names(opt_func: relax.Function, count: int) -> list[str]:
    """Names of the optimizer state slots, from the optimizer's own bindings
    (``p_w_m = optim_states[3]``); ``optim_state<k>`` where it names none."""
    names = [f"optim_state{k}" for k in range(count)]
    state_param = opt_func.params[2]
    for b in _bindings(opt_func):
        v = b.value
        if isinstance(v, relax.TupleGetItem) and v.tuple_value.same_as(state_param):
            names[int(v.index)] = b.var.name
    return names


def make_step(backbone: Backbone, loss: LossChoice, optimizer) -> TrainStep:
    """Build the one-function training step of ``backbone`` with ``loss`` and ``optimizer``.

    Raises
    ------
    TrainingError
        When the model uses an operator without a gradient (the message names it), or the
        Gradient pass finds nothing to differentiate.

    Examples
    --------
    >>> from tvm_pesto.train.backbone import make_backbone
    >>> from tvm_pesto.train.choices import make_loss, make_optimizer
    >>> bb = make_backbone("mlp_mixer")
    >>> step = make_step(bb, make_loss("auto", bb.output_type), make_optimizer("sgd"))
    >>> [p.name for p in step.mod["main"].params][:3]
    ['x', 'targets', 'p_stem_weight']
    """
    from tvm.relax.training import SetupTrainer

    missing = missing_gradients(backbone.func)
    if missing:
        raise TrainingError(f"model {backbone.name!r} uses operator(s) without a gradient in TVM: "
                            f"{', '.join(missing)}; register one with tvm.relax.op.register_gradient (see "
                            "tvm_pesto/train/gradients.py) or replace the layer in the model")
    trainer = SetupTrainer(loss.loss, optimizer, loss.args, legalize=False)(backbone.mod)
    adjoint, opt_func = trainer["backbone_loss_adjoint"], trainer["optimizer"]
    optim_init = [t.numpy() for t in trainer.attrs["optim_state"]]
    n_in, n_p, n_s = len(backbone.input_names), len(backbone.params), len(backbone.states)
    adj_params = list(adjoint.params)  # inputs, params, states, targets
    optim_names = _optim_state_names(opt_func, len(optim_init))

    inputs = [relax.Var(p.name, p.ty) for p in adj_params[:n_in]]
    targets = relax.Var("targets", adj_params[-1].ty)
    params = [relax.Var(p.name, p.ty) for p in adj_params[n_in:n_in + n_p]]
    states = [relax.Var(p.name, p.ty) for p in adj_params[n_in + n_p:n_in + n_p + n_s]]
    optim = [relax.Var(n, relax.TensorType(a.shape, str(a.dtype))) for n, a in zip(optim_names, optim_init)]

    adj_bindings = _bindings(adjoint)
    first_bwd = _first_backward(adj_bindings)
    owners = gradient_owners(adj_bindings, first_bwd)
    bb = relax.BlockBuilder()
    emitter = _Emitter(bb)
    adj_calls: dict = {}  # call binding of the adjoint -> its variable in main
    opt_calls: dict = {}
    with bb.function("main", inputs + [targets] + params + states + optim, attrs={"num_input": n_in + 1}):
        with bb.dataflow():
            loss_and_states, grads = emitter.emit(adjoint, inputs + params + states + [targets], adj_calls)
            if n_s:
                loss_val, new_states = loss_and_states[0], list(loss_and_states[1:])
            else:
                loss_val, new_states = loss_and_states, []
            new_params, new_optim = emitter.emit(opt_func, [tuple(params), tuple(grads), tuple(optim)], opt_calls)
            outs = [bb.emit_output(o) for o in [loss_val, *new_params, *new_states, *new_optim]]
        bb.emit_func_output(relax.Tuple(outs))
    mod = bb.get()
    index = {b.var: i for i, b in enumerate(_bindings(mod["main"]))}
    adj = {k: index[v] for k, v in adj_calls.items() if v in index}
    roles = {i: "forward" if k < first_bwd else "backward" for k, i in adj.items()}
    grad_of = {adj[k]: adj[i] for k, i in owners.items() if k in adj and i in adj}
    opt_owner = _update_owners(opt_func)
    update_of = {}
    for k, v in opt_calls.items():
        if v in index:
            roles[index[v]] = "update"
            if k in opt_owner:
                update_of[index[v]] = opt_owner[k]
    carried = backbone.param_names + backbone.state_names + optim_names
    init = [np.asarray(a) for a in backbone.params] + [np.asarray(a) for a in backbone.states] + optim_init
    return TrainStep(mod, trainer, backbone, loss, optimizer, n_in + 1, carried, init, roles, grad_of, update_of)


def _tuple_items(func: relax.Function, param: int) -> list:
    """The variables bound to ``func.params[param][k]``, in ``k`` order."""
    p = func.params[param]
    items = {}
    for b in _bindings(func):
        v = b.value
        if isinstance(v, relax.TupleGetItem) and v.tuple_value.same_as(p):
            items[int(v.index)] = b.var
    return [items[k] for k in sorted(items)]


def _leaves(expr, values) -> list:
    """The variables a (nested) tuple expression is made of, through tuple bindings."""
    if isinstance(expr, relax.Tuple):
        return [v for f in expr.fields for v in _leaves(f, values)]
    if isinstance(expr, relax.Var) and isinstance(values.get(expr), relax.Tuple):
        return _leaves(values[expr], values)
    return [expr]
