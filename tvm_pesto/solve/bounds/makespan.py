"""Lower bounds on the makespan of any plan, to judge how far a heuristic is from optimal.

Each bound holds for every plan the simulator accepts (transfers only add time):

* ``critical_path_s``: the longest path when every node takes its smallest cost among the
  devices its co-location group may use, and transfers are free.
* ``work_s``: the total of those smallest costs divided by the number of devices (every
  device does at most ``makespan`` seconds of work). Valid for unlike devices too.
* ``lp_s``: an LP relaxation (small graphs): fractional assignment ``x[v, k]`` with node
  durations ``sum_k c[v, k] x[v, k]``, precedence on those durations, per-device load and
  weight/output memory limits, and co-location; transfers ignored. Any plan's assignment
  and start times satisfy it, so its optimum is a bound, and it dominates the two above.
"""
from __future__ import annotations

import numpy as np

from ...plan.problem import Problem
from ..budget import combine, mode_name
from ..heuristics.common import colocation_index
from .paths import critical_path, min_costs

_SAFETY = 1e-6  # relative margin against LP solver tolerances


def lp_bound(problem: Problem, time_limit_s: float = 30.0, precedence: bool = True) -> tuple[float | None, str]:
    """The LP relaxation described in the module docstring; returns ``(seconds, status)``.

    ``seconds`` is None when the LP could not be solved; ``inf`` when it is infeasible (the
    weights and outputs cannot be split over the devices even fractionally).
    ``precedence=False`` drops the start times: the optimum is then a bound on the largest
    device load (fractional load balancing with memory and co-location), the throughput
    objective's bottleneck (:mod:`tvm_pesto.solve.bounds.objective`).
    """
    import pulp

    from ..mip import lp_backend  # lazy: PuLP only when the LP is asked for

    n, d = problem.num_nodes, problem.num_devices
    if n == 0:
        return 0.0, "empty"
    allowed = np.isfinite(problem.costs)
    # work in units of the largest finite cost so the solver's tolerances are relative
    scale = float(problem.costs[allowed].max()) if allowed.any() else 1.0
    scale = scale if scale > 0 else 1.0
    c = np.where(allowed, problem.costs, 0.0) / scale
    group_of, groups = colocation_index(problem)
    for members in groups:
        allowed[members] = allowed[members].all(axis=0)
    lp = pulp.LpProblem("makespan_lower_bound", pulp.LpMinimize)
    T = lp.add_variable("T", 0)
    x = {(v, k): lp.add_variable(f"x_{v}_{k}", 0, 1) for v in range(n) for k in range(d) if allowed[v, k]}
    s = [lp.add_variable(f"s_{v}", 0) for v in range(n)] if precedence else []
    lp += T
    dur = []
    for v in range(n):
        ks = [k for k in range(d) if allowed[v, k]]
        lp += pulp.lpSum(x[v, k] for k in ks) == 1
        dur.append(pulp.lpSum(float(c[v, k]) * x[v, k] for k in ks))
        if precedence:
            lp += s[v] + dur[v] <= T
    for members in groups:
        ref = members[0]
        for w in members[1:]:
            for k in range(d):
                if allowed[ref, k]:
                    lp += x[w, k] == x[ref, k]
    for u, v in zip(problem.src.tolist(), problem.dst.tolist()) if precedence else ():
        lp += s[v] >= s[u] + dur[u]
    for k in range(d):
        on_k = [v for v in range(n) if allowed[v, k]]
        if not on_k:
            continue
        lp += pulp.lpSum(float(c[v, k]) * x[v, k] for v in on_k) <= T
        if problem.mem[on_k].sum() > problem.capacity[k]:
            cap = float(problem.capacity[k])
            lp += pulp.lpSum(float(problem.mem[v] / cap) * x[v, k] for v in on_k) <= 1.0
    backend = lp_backend(time_limit_s, "lower_bound: the LP relaxation", ", or pass lp=False")
    status = pulp.LpStatus[lp.solve(backend)]
    if status == "Infeasible":
        return float("inf"), status
    if status != "Optimal" or T.value() is None:
        return None, status
    return float(T.value()) * scale, status


def lower_bound(problem: Problem, lp: bool | None = None, lp_max_nodes: int = 1000, comm: bool | None = None,
                comm_max_nodes: int = 5000, deterministic: bool | None = None) -> dict:
    """Lower bounds on the makespan of ``problem``, in seconds.

    Parameters
    ----------
    problem : Problem
    lp : bool, optional
        Solve the LP relaxation; by default only when the graph has at most
        ``lp_max_nodes`` nodes.
    lp_max_nodes : int
    comm : bool, optional
        Compute the transfer-aware bounds of :mod:`.comm`; by default only when the
        graph has at most ``comm_max_nodes`` nodes (each distinct graph segment is a small MIP).
    comm_max_nodes : int
    deterministic : bool, optional
        Node limits instead of time limits for the segment MIPs (and no total time budget),
        see :func:`tvm_pesto.solve.bounds.comm.segment_bound`; default: the ambient mode.

    Returns
    -------
    dict
        ``critical_path_s``, ``work_s``, ``lp_s`` (None when skipped or unsolved),
        ``lp_status``, ``segment_s`` and ``path_memory_s`` (None when skipped), ``segment``
        (facts of the segment bound), ``best`` (the largest of them), ``budget`` (the mode)
        and ``deterministic`` (no clock decided a bound; else ``deterministic_reason``).

    Examples
    --------
    >>> from tvm_pesto.bench.random_dag import dnn_like_problem
    >>> problem = dnn_like_problem(12, cluster="2xV100-nvlink")   # 12 ops, 2 GPUs
    >>> from tvm_pesto.plan import simulate
    >>> from tvm_pesto.solve import solve
    >>> lb = lower_bound(problem)
    >>> lb["best"] <= simulate(problem, solve(problem, "heft")).makespan
    True
    """
    mc = min_costs(problem)
    cp = critical_path(problem, mc)
    work = float(mc.sum() / problem.num_devices) if problem.num_nodes else 0.0
    out = {"critical_path_s": cp, "work_s": work, "lp_s": None, "lp_status": "skipped"}
    if lp is None:
        lp = problem.num_nodes <= lp_max_nodes
    if lp:
        val, status = lp_bound(problem)
        out["lp_status"] = status
        if val is not None:
            out["lp_s"] = val if not np.isfinite(val) else max(0.0, val * (1 - _SAFETY) - 1e-12)
    out.update(segment_s=None, path_memory_s=None)
    if comm is None:
        comm = problem.num_nodes <= comm_max_nodes
    if comm and problem.num_nodes:
        from .comm import path_memory_bound, segment_bound  # lazy: imports the MIP (PuLP) only when asked

        seg = segment_bound(problem, deterministic=deterministic)
        out["segment_s"] = seg["bound_s"]
        out["segment"] = {k: v for k, v in seg.items() if k != "bound_s"}
        out["path_memory_s"] = path_memory_bound(problem)["bound_s"]
    vals = [v for v in (cp, work, out["lp_s"], out["segment_s"], out["path_memory_s"]) if v is not None]
    out["best"] = float(max(vals))
    out["budget"] = mode_name(deterministic)
    out.update(combine({"deterministic": True}, out.get("segment")))
    return out
