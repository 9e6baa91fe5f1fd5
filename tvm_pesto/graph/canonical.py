"""Say once what an importer spelled out: the canonical form of an imported Relax function.

TVM's PyTorch importer (``tvm.relax.frontend.torch.from_exported_program``, which decomposes
the program to core ATen first) writes a batched ``matmul`` as ``expand`` (a ``broadcast_to``,
often to the shape it already has), ``view`` to 3-D, ``bmm`` and ``view`` back; a linear layer
as a ``view`` to 2-D, ``addmm`` and a ``view`` back; a head split and merge as chains of
``permute_dims``; and ``scaled_dot_product_attention`` with torch's *safe* softmax, a softmax
followed by seven calls that zero a row of scores that are all ``-inf`` (a row a mask removed
entirely). Each is a full pass over its tensor in every library, and each is a node the
candidates, the cost model and the solver have to carry: timm's ``pit_ti_224`` comes out as
706 calls, 390 in this form.

:func:`canonicalize` rewrites, to a fixed point, each call whose value does not change:

- a ``broadcast_to`` or ``reshape`` to the shape its input has: that input;
- a ``reshape`` of a ``reshape``: one ``reshape`` (none where the two cancel);
- a ``permute_dims`` of a ``permute_dims``: one (none where the two cancel);
- ``reshape(matmul(reshape(a), reshape(b)))`` where the inner reshapes merge the batch dims
  ``a`` and ``b`` share and the outer one splits them again: ``matmul(a, b)``;
- ``reshape([add(c,] matmul(reshape(x), w)[)])`` where the inner reshape merges ``x``'s leading
  dims, ``w`` is 2-D, ``c`` a constant vector and the outer reshape splits the dims again:
  ``matmul(x, w)`` [``+ c``];
- the safe softmax of scores that carry no mask: scores a ``matmul`` gives, through reshapes,
  transposes and constant scales, have a row of ``-inf`` only where an input is infinite, so
  ``where(row all -inf, 0, softmax(s))`` is ``softmax(s)``. Scores with anything added (a mask)
  keep the safe form.

A rule that would compute a call's value again beside it (a link of a chain, a matmul, that
other calls read too) is not applied; every other call is left as it is, and calls no longer
read are dropped.

Examples
--------
>>> import numpy as np
>>> from tvm import relax
>>> bb = relax.BlockBuilder()
>>> a = relax.Var("a", relax.TensorType((2, 4, 8, 16), "float32"))
>>> b = relax.Var("b", relax.TensorType((2, 4, 16, 8), "float32"))
>>> with bb.function("main", [a, b]):
...     with bb.dataflow():
...         a3 = bb.emit(relax.op.reshape(relax.op.broadcast_to(a, (2, 4, 8, 16)), (8, 8, 16)))
...         b3 = bb.emit(relax.op.reshape(b, (8, 16, 8)))
...         out = bb.emit_output(relax.op.reshape(relax.op.matmul(a3, b3), (2, 4, 8, 8)))
...     _ = bb.emit_func_output(out)
>>> [b.value.op.name for b in canonicalize(bb.get())["main"].body.blocks[0].bindings]
['relax.matmul']
"""
from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

#: Rounds of rewriting at most; one rule's result can make another's pattern (a reshape pair
#: around a matmul is there only once the broadcast under it is gone), so a round repeats
#: while it removes calls. Four reach the fixed point on every corpus model.
MAX_ROUNDS = 4

#: The calls of torch's safe softmax after ``softmax(s)``: ``where(not(any(s != -inf)), 0, p)``
#: as the importer spells ``any`` (a ``max`` over int8).
_SAFE_MASK_CHAIN = ("relax.logical_not", "relax.astype", "relax.max", "relax.astype", "relax.logical_not",
                    "relax.equal")

#: Calls between a matmul and the scores a softmax reads that cannot make a row all ``-inf``
#: (they move values, or scale them by a finite constant).
_SCORE_KEEPERS = ("relax.reshape", "relax.permute_dims", "relax.multiply", "relax.divide")


def _shape(expr) -> tuple[int, ...] | None:
    ty = getattr(expr, "ty", None)
    shape = getattr(ty, "shape", None)
    if shape is None or not isinstance(ty, relax.TensorType):
        return None
    try:
        return tuple(int(s) for s in shape.values)
    except (TypeError, AttributeError):  # a symbolic dimension: no rule applies
        return None


def _op(expr) -> str:
    if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
        return expr.op.name
    return ""


def _finite_scalar(expr, nonzero: bool = False) -> bool:
    if not isinstance(expr, tvm.ir.Constant):
        return False
    data = expr.value.numpy()
    return data.size == 1 and bool(np.isfinite(data).all()) and not (nonzero and not data.all())


def _zeros(expr) -> bool:
    return isinstance(expr, tvm.ir.Constant) and not np.any(expr.value.numpy())


@mutator
class _Canonical(PyExprMutator):
    """One round of the rewrites in the module docstring, over one function."""

    def __init__(self, mod: tvm.IRModule, func: relax.Function):
        super().__init__(mod)
        self._uses = _uses(func)

    def _alone(self, var) -> bool:
        """Whether ``var`` is read once (by the call being rewritten): a rewrite that computes
        its value again elsewhere would otherwise compute it twice. A variable this round made
        has its one reader."""
        return self._uses.get(var, 1) == 1

    def _bound(self, expr):
        """The call ``expr`` is bound to (through aliases), or None."""
        while isinstance(expr, relax.Var):
            expr = self.lookup_binding(expr)
        return expr if isinstance(expr, relax.Call) else None

    def visit_call_(self, call):
        call = self.builder_.normalize(super().visit_call_(call))
        rule = _RULES.get(_op(call))
        if rule is None or _shape(call) is None:
            return call
        new = getattr(self, rule)(call)
        return call if new is None else new

    # the rules: each returns the call's replacement, or None to keep it
    def _same_shape(self, call):
        return call.args[0] if _shape(call.args[0]) == _shape(call) else None

    def _reshape(self, call):
        x, shape = call.args[0], _shape(call)
        if _shape(x) == shape:
            return x
        inner = self._bound(x)
        if _op(inner) == "relax.reshape":
            if _shape(inner.args[0]) == shape:
                return inner.args[0]
            return relax.op.reshape(inner.args[0], shape) if self._alone(x) else None
        if _op(inner) == "relax.matmul" and self._alone(x):
            new = self._batched_matmul(inner, shape)
            return new if new is not None else self._linear(inner, None, shape)
        if _op(inner) == "relax.add" and self._alone(x):
            for c, mm in (inner.args, reversed(inner.args)):
                bound = self._bound(mm)
                if (_op(bound) == "relax.matmul" and self._alone(mm) and isinstance(c, tvm.ir.Constant)
                        and len(_shape(c) or (0, 0)) <= 1):
                    return self._linear(bound, c, shape)
        return None

    def _batched_matmul(self, mm, shape):
        a, b = self._bound(mm.args[0]), self._bound(mm.args[1])
        if _op(a) != "relax.reshape" or _op(b) != "relax.reshape":
            return None
        sa, sb = _shape(a.args[0]), _shape(b.args[0])
        if sa is None or sb is None or not len(sa) == len(sb) == len(shape) >= 3:
            return None
        batch = sa[:-2]
        ok = (sb[:-2] == batch and shape[:-2] == batch and sa[-1] == sb[-2] and shape[-2:] == (sa[-2], sb[-1])
              and _shape(a) == (math.prod(batch),) + sa[-2:] and _shape(b) == (math.prod(batch),) + sb[-2:])
        return relax.op.matmul(a.args[0], b.args[0], out_dtype=mm.attrs.out_dtype) if ok else None

    def _linear(self, mm, bias, shape):
        x, w = self._bound(mm.args[0]), mm.args[1]
        if _op(x) != "relax.reshape" or _shape(w) is None or len(_shape(w)) != 2:
            return None
        sx = _shape(x.args[0])
        if sx is None or len(sx) < 2 or _shape(x) != (math.prod(sx[:-1]), sx[-1]) or shape != sx[:-1] + _shape(w)[1:]:
            return None
        out = relax.op.matmul(x.args[0], w, out_dtype=mm.attrs.out_dtype)
        return out if bias is None else relax.op.add(out, bias)

    def _permute(self, call):
        axes = call.attrs.axes
        if axes is None:
            return None
        axes = [int(a) for a in axes]
        if axes == list(range(len(axes))):
            return call.args[0]
        inner = self._bound(call.args[0])
        if _op(inner) != "relax.permute_dims" or inner.attrs.axes is None:
            return None
        first = [int(a) for a in inner.attrs.axes]
        both = [first[a] for a in axes]
        if both == list(range(len(both))):
            return inner.args[0]
        return relax.op.permute_dims(inner.args[0], both) if self._alone(call.args[0]) else None

    def _safe_softmax(self, call):
        cond, zero, probs = call.args
        softmax = self._bound(probs)
        if _op(softmax) != "relax.nn.softmax" or not _zeros(zero):
            return None
        scores = softmax.args[0]
        step = self._bound(cond)
        for name in _SAFE_MASK_CHAIN:
            if _op(step) != name:
                return None
            if name == "relax.equal":
                return probs if self._unmasked(step, scores) else None
            step = self._bound(step.args[0])
        return None

    def _unmasked(self, equal, scores) -> bool:
        """``equal`` compares ``scores`` with ``-inf``, and ``scores`` come from a matmul
        through calls that cannot make a row all ``-inf``."""
        inf = equal.args[1]
        if not equal.args[0].same_as(scores) or not isinstance(inf, tvm.ir.Constant):
            return False
        if inf.value.numpy().size != 1 or inf.value.numpy().item() != -np.inf:
            return False
        step = self._bound(scores)
        while _op(step) in _SCORE_KEEPERS:
            if _op(step) in ("relax.multiply", "relax.divide") and \
                    not _finite_scalar(step.args[1], nonzero=_op(step) == "relax.divide"):
                return False  # a scale that is not a finite number (a divisor of 0 makes -inf)
            step = self._bound(step.args[0])
        return _op(step) == "relax.matmul"


#: The rule (a method of the rewriter) for each op that has one.
_RULES = {"relax.broadcast_to": "_same_shape", "relax.reshape": "_reshape", "relax.permute_dims": "_permute",
          "relax.where": "_safe_softmax"}


def _uses(func: relax.Function) -> dict:
    """How many times each variable is read in ``func`` (its bindings and its result)."""
    count: dict = {}

    def seen(e):
        if isinstance(e, relax.Var):
            count[e] = count.get(e, 0) + 1

    for blk in func.body.blocks:
        for b in blk.bindings:
            relax.analysis.post_order_visit(b.value, seen)
    relax.analysis.post_order_visit(func.body.body, seen)
    return count


def _calls(func: relax.Function) -> int:
    return sum(isinstance(b.value, relax.Call) for blk in func.body.blocks for b in blk.bindings)


def canonicalize(mod: tvm.IRModule, func_name: str = "main") -> tvm.IRModule:
    """``mod`` with ``mod[func_name]`` in canonical form (the module docstring's rewrites);
    the other functions as they are. A function that is not plain Relax bindings comes back
    unchanged."""
    func = mod[func_name]
    if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
        return mod
    mod = mod.clone()  # the caller's module stays as it is
    gv = mod.get_global_var(func_name)
    for _ in range(MAX_ROUNDS):
        before = _calls(func)
        mod.update_func(gv, _Canonical(mod, func).visit_expr(func))
        # aliases the rewrites left (``y = x``) read through, then the calls no longer read
        # dropped: on this function alone, the module's others stay as they are
        alone = relax.transform.CanonicalizeBindings()(tvm.IRModule({func_name: mod[func_name]}))
        func = relax.analysis.remove_all_unused(alone[func_name])
        mod.update_func(gv, func)
        if _calls(func) == before:
            break
    return mod


__all__ = ["MAX_ROUNDS", "canonicalize"]
