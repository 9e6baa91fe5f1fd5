"""Training constraints on the placement of a step, as co-location groups of op nodes.

The groups Pesto and Baechi use for training graphs, over the op graph of
:attr:`TrainStep.mod <tvm_pesto.train.step.TrainStep>` (``JointProblem.colocate``; the
placement solvers keep each group on one device):

* **forward + gradient**: a forward operator and the gradient operators of its turn in the
  Gradient pass (:attr:`TrainStep.grad_of`), so the activations a gradient reads are
  local and the gradient flows back along the forward placement;
* **parameter + update**: every operator that reads a parameter (forward and gradient)
  and the optimizer operators that update it (:attr:`TrainStep.update_of`), so the
  parameter, its optimizer state and its update never cross devices;
* **carried value + next value**: every operator that reads a carried input (parameter,
  BatchNorm running statistic, optimizer state) and the operator that makes its next
  value, so the next value is born where the runtime keeps it
  (:func:`tvm_pesto.builder.rewrite.apply_plan` with ``state``).

Groups overlap; the solvers merge overlapping groups (``colocation_index``).
:func:`group_summary` says how much freedom is left.
"""
from __future__ import annotations

import networkx as nx
from tvm import relax

from ..graph.relax_import import RelaxGraph
from .step import TrainStep

__all__ = ["group_summary", "training_colocation"]


def _readers(rg: RelaxGraph, node_of: dict) -> dict:
    """Input variable of ``main`` -> op nodes that read it."""
    out: dict = {}
    for k, b in enumerate(rg.bindings):
        if k not in node_of:
            continue
        for v in relax.analysis.free_vars(b.value):
            out.setdefault(v, set()).add(node_of[k])
    return out


def _producer(rg: RelaxGraph, var, node_of: dict, index: dict):
    """The op node that makes ``var`` (through aliases), or None for an input."""
    seen = set()
    while var in index and var not in seen:
        seen.add(var)
        k = index[var]
        if k in node_of:
            return node_of[k]
        val = rg.bindings[k].value
        var = val if isinstance(val, relax.Var) else None
    return None


def training_colocation(step: TrainStep, rg: RelaxGraph) -> list[list[int]]:
    """The co-location groups of ``step`` (see the module docstring) as op-node ids of ``rg``.

    Parameters
    ----------
    step : TrainStep
    rg : RelaxGraph
        The op graph of ``step.mod`` (``tvm_pesto.analyze(step.mod).rg``).

    Returns
    -------
    list of list of int
        Groups of two or more nodes, possibly overlapping.
    """
    node_of = {b: i for i, b in enumerate(rg.node_binding)}
    index = {b.var: k for k, b in enumerate(rg.bindings)}
    groups: list[list[int]] = []
    by_forward: dict[int, set] = {}
    for bwd, fwd in step.grad_of.items():
        if bwd in node_of and fwd in node_of:
            by_forward.setdefault(node_of[fwd], {node_of[fwd]}).add(node_of[bwd])
    groups.extend(sorted(g) for g in by_forward.values())
    readers = _readers(rg, node_of)
    params = list(rg.func.params)
    updates: dict[int, set] = {}
    for k, p in step.update_of.items():
        if k in node_of:
            updates.setdefault(p, set()).add(node_of[k])
    for p in range(step.num_params):
        var = params[step.num_input + p]
        groups.append(sorted(readers.get(var, set()) | updates.get(p, set())))
    fields = rg.output.fields
    for o, i in step.carry:
        made = _producer(rg, fields[o], node_of, index)
        groups.append(sorted(readers.get(params[i], set()) | ({made} if made is not None else set())))
    return [g for g in groups if len(g) > 1]


def group_summary(groups: list[list[int]], num_nodes: int) -> dict:
    """How constrained the placement is: merged groups, the largest one, nodes left free.

    Examples
    --------
    >>> group_summary([[0, 1], [1, 2], [4, 5]], 7)
    {'groups': 2, 'largest': 3, 'grouped_nodes': 5, 'free_nodes': 2}
    """
    uf = nx.utils.UnionFind()
    for g in groups:
        uf.union(*g)
    sets = [s for s in uf.to_sets() if len(s) > 1]
    grouped = sum(len(s) for s in sets)
    return {"groups": len(sets), "largest": max((len(s) for s in sets), default=0), "grouped_nodes": grouped,
            "free_nodes": num_nodes - grouped}
