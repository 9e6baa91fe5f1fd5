"""A Relax module analysed: its op graph, TVM-style fusion groups and the grouped graph.

The first step of every flow (:func:`tvm_pesto.analyze` is this function); it sits with the
graph it builds so that the later stages (candidates, costs, the cost-model lab) can call it
without importing the facade :mod:`tvm_pesto.api`.

Examples
--------
>>> from tvm_pesto.candidates.examples import tiny_mlp
>>> a = analyze(tiny_mlp()[0])
>>> a.graph.num_nodes == len(a.groups), a.op_graph.num_nodes >= len(a.groups)
(True, True)
"""
from __future__ import annotations

from dataclasses import dataclass

import tvm

from .fusion import fusion_groups
from .opgraph import OpGraph
from .relax_import import RelaxGraph, from_relax


@dataclass
class Analysis:
    """A module's op graph, its fusion groups and the grouped graph."""

    rg: RelaxGraph
    groups: list[list[int]]
    graph: OpGraph  # one node per fusion group

    @property
    def op_graph(self) -> OpGraph:
        return self.rg.graph


def analyze(mod: tvm.IRModule, func_name: str = "main") -> Analysis:
    """Extract the op graph of ``mod`` and group it into fusion groups."""
    rg = from_relax(mod, func_name)
    groups = fusion_groups(rg.graph)
    return Analysis(rg, groups, rg.graph.contract(groups, name=rg.graph.name))


__all__ = ["Analysis", "analyze"]
