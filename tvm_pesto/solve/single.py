"""Everything on one device: the fastest single device that can hold the whole graph."""
from __future__ import annotations

import numpy as np

from ..errors import InfeasibleError
from ..plan.plan import Plan
from ..plan.problem import Problem
from .common import NoFit, run_solver

NAME = "single"


def _single(problem: Problem):
    n, d = problem.num_nodes, problem.num_devices
    total = problem.costs.sum(axis=0)  # inf where some node cannot run
    need = problem.mem.sum()
    fits = np.isfinite(total) & (need <= problem.capacity * (1 + 1e-9))
    if not fits.any():
        runnable = np.isfinite(total)
        if not runnable.any():
            k = int(np.argmin((~np.isfinite(problem.costs)).sum(axis=0)))
            bad = int(np.flatnonzero(~np.isfinite(problem.costs[:, k]))[0])
            raise InfeasibleError(
                f"{problem.graph.name}: no single device of {problem.cluster.name} can run every node "
                f"(e.g. {problem.graph.nodes[bad].name} cannot run on {problem.cluster.devices[k].name}); "
                "use a solver that splits the graph, such as heft or m-etf")
        raise NoFit(int(np.argmax(problem.mem)) if n else -1, "no single device holds the whole graph")
    k = int(np.flatnonzero(fits)[np.argmin(total[fits])])
    assignment = np.full(n, k, dtype=np.int32)
    order: list[list[int]] = [[] for _ in range(d)]
    order[k] = problem.graph.topo_order()
    info = {"device": k, "estimated_makespan_s": float(total[k]),
            "peak_memory_bytes": [float(need) if j == k else 0.0 for j in range(d)]}
    return assignment, order, info


def solve(problem: Problem) -> Plan:
    """Put every node on the fastest device (smallest total cost) that can hold them all.

    Raises
    ------
    InfeasibleError
        When no device can run every node or hold the whole graph; the message names the
        memory that would work.

    Examples
    --------
    >>> from tvm_pesto.solve import solve as run
    >>> # plan = run(problem, "single")
    """
    return run_solver(problem, NAME, _single)
