"""Everything on one device: the one single-device plan builder of the package.

:func:`one_device_plan` puts every node on a given device in topological order;
:func:`fastest_single_device` picks the device with the smallest total cost that can run
every node and hold the whole graph; :func:`solve` (the registry's ``"single"``) combines them.
"""
from __future__ import annotations

import numpy as np

from ...errors import InfeasibleError
from ...plan.plan import Plan
from ...plan.problem import Problem
from .common import NoFit, run_solver

NAME = "single"


def one_device_plan(problem: Problem, device: int, solver: str = NAME) -> Plan:
    """Every node of ``problem`` on ``device``, in the graph's topological order.

    No feasibility check: a device that cannot run a node or hold the graph still gets it
    (the simulator reports that); see :func:`fastest_single_device` for a device that can.

    Examples
    --------
    >>> from tvm_pesto.graph.opgraph import OpGraph, OpNode
    >>> from tvm_pesto.cluster import parse_cluster
    >>> g = OpGraph([OpNode(c, "op") for c in "abc"], [(0, 1, 1), (0, 2, 1)])
    >>> p = Problem(g, parse_cluster("cpu:2"), np.ones((3, 2)))
    >>> one_device_plan(p, 1).order
    [[], [0, 1, 2]]
    """
    n, d = problem.num_nodes, problem.num_devices
    order: list[list[int]] = [[] for _ in range(d)]
    order[device] = list(problem.graph.topo_order())
    return Plan(np.full(n, device, dtype=np.int32), order, solver=solver)


def fastest_single_device(problem: Problem) -> int | None:
    """The device with the smallest total cost among those that can run every node and hold
    the whole graph's memory (the lowest index on a tie); None when no device can.

    Examples
    --------
    >>> from tvm_pesto.graph.opgraph import OpGraph, OpNode
    >>> from tvm_pesto.cluster import parse_cluster
    >>> g = OpGraph([OpNode(c, "op") for c in "ab"], [(0, 1, 1)])
    >>> fastest_single_device(Problem(g, parse_cluster("cpu:2"), np.array([[2.0, 1.0], [2.0, 1.5]])))
    1
    """
    total = problem.costs.sum(axis=0)  # inf where some node cannot run
    fits = np.isfinite(total) & (problem.mem.sum() <= problem.capacity * (1 + 1e-9))
    if not fits.any():
        return None
    return int(np.flatnonzero(fits)[np.argmin(total[fits])])


def _single(problem: Problem):
    n, d = problem.num_nodes, problem.num_devices
    k = fastest_single_device(problem)
    if k is None:
        runnable = np.isfinite(problem.costs.sum(axis=0))
        if not runnable.any():
            k = int(np.argmin((~np.isfinite(problem.costs)).sum(axis=0)))
            bad = int(np.flatnonzero(~np.isfinite(problem.costs[:, k]))[0])
            raise InfeasibleError(
                f"{problem.graph.name}: no single device of {problem.cluster.name} can run every node "
                f"(e.g. {problem.graph.nodes[bad].name} cannot run on {problem.cluster.devices[k].name}); "
                "use a solver that splits the graph, such as heft or m-etf")
        raise NoFit(int(np.argmax(problem.mem)) if n else -1, "no single device holds the whole graph")
    plan = one_device_plan(problem, k)
    need = float(problem.mem.sum())
    info = {"device": k, "estimated_makespan_s": float(problem.costs.sum(axis=0)[k]),
            "peak_memory_bytes": [need if j == k else 0.0 for j in range(d)]}
    return plan.assignment, plan.order, info


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
    >>> from tvm_pesto.bench.random_dag import dnn_like_problem
    >>> problem = dnn_like_problem(12, cluster="2xV100-nvlink")   # 12 ops, 2 GPUs
    >>> plan = run(problem, "single")
    >>> plan.solver, len(plan.assignment)
    ('single', 12)
    """
    return run_solver(problem, NAME, _single)


__all__ = ["NAME", "fastest_single_device", "one_device_plan", "solve"]
