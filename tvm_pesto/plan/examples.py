"""Small joint problems for the solvers' runnable examples.

Examples
--------
>>> problem = chain_with_a_library_call()
>>> problem.graph.num_nodes, len(problem.candidates), problem.num_devices
(3, 4, 2)
"""
from __future__ import annotations

import numpy as np

from ..candidates import Candidate
from ..cluster import parse_cluster
from ..graph import OpGraph, OpNode
from .problem import JointProblem


def chain_with_a_library_call() -> JointProblem:
    """``a -> b -> c`` on two GPUs: a ``tvm`` call per op (2, 2 and 1 s) and one ``torch``
    call for ``a`` and ``b`` together (3 s), the same on both devices. The best plan runs the
    torch call, then ``c``: 4 s."""
    g = OpGraph([OpNode(c, "relax.add") for c in "abc"], [(0, 1, 4), (1, 2, 4)])
    cands = [Candidate("tvm", (0,)), Candidate("tvm", (1,)), Candidate("tvm", (2,)), Candidate("torch", (0, 1))]
    costs = np.array([[2.0, 2.0], [2.0, 2.0], [1.0, 1.0], [3.0, 3.0]])  # seconds per candidate, device
    return JointProblem(g, parse_cluster("2xV100-nvlink"), cands, costs)


__all__ = ["chain_with_a_library_call"]
