"""Rewrites of an exported ONNX graph into the forms the libraries have kernels for.

The exporter converts one Relax op at a time; a few activations reach Relax already broken
into elementwise ops (torch's ``hardsigmoid``/``hardswish`` arrive as ``add``, ``clip``,
``divide`` and ``multiply``). ONNX Runtime and OpenVINO run each of those as its own pass over
the tensor, and the pass breaks their layout propagation (ONNX Runtime reorders blocked
layouts around it). :func:`fuse_hard_activations` writes them back as the single ONNX ops.
And ``rsqrt`` exports as ``Reciprocal(Sqrt(v))``, so an RMS norm's ``x * rsqrt(mean(x^2) + eps)``
reaches ONNX Runtime as a ``Mul`` of a ``Reciprocal``, which its ``SimplifiedLayerNormalization``
fusion does not match (it looks for a ``Div``): :func:`divide_by_reciprocals` writes
``a * Reciprocal(b)`` as ``a / b`` (a T5-style encoder, one thread: 48.8 -> 37.6 us a call, the
same as the model's own ONNX from ``torch.onnx.export``).

Examples
--------
>>> import numpy as np
>>> from onnx import helper, numpy_helper
>>> inits = [numpy_helper.from_array(np.array(v, "float32"), n) for n, v in
...          (("three", 3.0), ("zero", 0.0), ("six", 6.0))]
>>> nodes = [helper.make_node("Add", ["x", "three"], ["a"]),
...          helper.make_node("Clip", ["a", "zero", "six"], ["c"]),
...          helper.make_node("Div", ["c", "six"], ["h"]),
...          helper.make_node("Mul", ["x", "h"], ["y"])]
>>> nodes, inits = fuse_hard_activations(nodes, inits, keep={"y"})
>>> [n.op_type for n in nodes], inits
(['HardSwish'], [])
"""
from __future__ import annotations

from collections import Counter

import numpy as np


def _scalar(consts: dict, name: str, value: float) -> bool:
    a = consts.get(name)
    return a is not None and a.size == 1 and float(np.asarray(a).reshape(())) == value


def fuse_hard_activations(nodes: list, inits: list, keep: set[str]) -> tuple[list, list]:
    """``x + 3 -> clip(0, 6) -> / 6`` becomes ``HardSigmoid(x)`` (alpha 1/6, beta 1/2), and
    ``x * HardSigmoid(x)`` becomes ``HardSwish(x)``.

    Parameters
    ----------
    nodes : list of onnx.NodeProto
        The graph's nodes in order.
    inits : list of onnx.TensorProto
        Its initializers (the constants 3, 0 and 6 are read from them).
    keep : set of str
        Names the graph returns: an intermediate value in ``keep`` is never fused away.

    Returns
    -------
    (nodes, inits)
        The rewritten nodes, in order, and the initializers still read by some node.
    """
    from onnx import helper, numpy_helper

    # the scalars only: a copy of every weight would double the export's memory
    consts = {t.name: numpy_helper.to_array(t) for t in inits if int(np.prod(t.dims)) <= 1}
    producer = {o: n for n in nodes for o in n.output}
    uses = Counter(i for n in nodes for i in n.input)
    uses.update(keep)

    def only_use(node) -> bool:
        return node is not None and uses[node.output[0]] == 1

    replaced: dict[int, object] = {}  # id(node) -> its replacement (None: removed)
    for div in nodes:
        if div.op_type != "Div" or not _scalar(consts, div.input[1], 6.0):
            continue
        clip = producer.get(div.input[0])
        if not (only_use(clip) and clip.op_type == "Clip" and len(clip.input) == 3
                and _scalar(consts, clip.input[1], 0.0) and _scalar(consts, clip.input[2], 6.0)):
            continue
        add = producer.get(clip.input[0])
        if not (only_use(add) and add.op_type == "Add"):
            continue
        x = add.input[0] if _scalar(consts, add.input[1], 3.0) else add.input[1] if _scalar(consts, add.input[0], 3.0) \
            else None
        if x is None:
            continue
        replaced[id(add)] = replaced[id(clip)] = None
        replaced[id(div)] = helper.make_node("HardSigmoid", [x], [div.output[0]], name=div.name, alpha=1 / 6, beta=0.5)
    hard = {n.output[0]: n for n in replaced.values() if n is not None}
    for mul in nodes:
        if mul.op_type != "Mul":
            continue
        for x, h in ((mul.input[0], mul.input[1]), (mul.input[1], mul.input[0])):
            hs = hard.get(h)
            if hs is not None and hs.input[0] == x and uses[h] == 1:
                replaced[id(mul)] = helper.make_node("HardSwish", [x], [mul.output[0]], name=mul.name)
                replaced[id(producer[h])] = None
                hard.pop(h)
                break
    out = [replaced.get(id(n), n) for n in nodes]
    out = [n for n in out if n is not None]
    read = {i for n in out for i in n.input}
    return out, [t for t in inits if t.name in read or t.name in keep]


def divide_by_reciprocals(nodes: list, keep: set[str]) -> list:
    """Each ``Mul(a, Reciprocal(b))`` (either operand order) whose reciprocal nothing else reads
    becomes ``Div(a, b)``.

    Examples
    --------
    >>> from onnx import helper
    >>> nodes = [helper.make_node("Sqrt", ["v"], ["s"]), helper.make_node("Reciprocal", ["s"], ["r"]),
    ...          helper.make_node("Mul", ["x", "r"], ["y"])]
    >>> [(n.op_type, list(n.input)) for n in divide_by_reciprocals(nodes, keep={"y"})]
    [('Sqrt', ['v']), ('Div', ['x', 's'])]
    """
    from onnx import helper

    producer = {o: n for n in nodes for o in n.output}
    uses = Counter(i for n in nodes for i in n.input)
    uses.update(keep)
    replaced: dict[int, object] = {}
    for mul in nodes:
        if mul.op_type != "Mul" or len(mul.input) != 2:
            continue
        for a, r in ((mul.input[0], mul.input[1]), (mul.input[1], mul.input[0])):
            rec = producer.get(r)
            if rec is not None and rec.op_type == "Reciprocal" and uses[r] == 1 and id(rec) not in replaced:
                replaced[id(rec)] = None
                replaced[id(mul)] = helper.make_node("Div", [a, rec.input[0]], list(mul.output), name=mul.name)
                break
    out = [replaced.get(id(n), n) for n in nodes]
    return [n for n in out if n is not None]


__all__ = ["divide_by_reciprocals", "fuse_hard_activations"]
