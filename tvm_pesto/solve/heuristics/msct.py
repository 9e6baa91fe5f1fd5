"""m-SCT: memory-constrained Small Communication Time placement (Baechi, SoCC'20).

SCT (Hanen and Munier, 1995) is ETF plus a *favourite child* rule: each node has at most
one favourite child and each node at most one favourite parent, and a favourite child runs
on its parent's device right after it when that device is (one of) the earliest places it
could start. The favourites come from the linear program

    minimise  w
    s.t.      s_u + p_u + c_uv x_uv <= s_v          for every edge u -> v
              sum_v x_uv >= outdeg(u) - 1           (at most one favourite child)
              sum_u x_uv >= indeg(v) - 1            (at most one favourite parent)
              s_v + p_v <= w,  s >= 0,  0 <= x <= 1

where ``p`` is a node's mean cost and ``c`` an edge's mean transfer time; ``x_uv`` below
the rounding threshold makes ``v`` the favourite child of ``u``. Conflicts left by rounding
are resolved greedily (smallest ``x`` first, then largest transfer). Solved with PuLP/CBC.
Graphs above ``lp_max_nodes`` use a greedy rule instead (largest outgoing transfer).
"""
from __future__ import annotations

import time

import numpy as np

from ...errors import SolverError
from ...plan.plan import Plan
from ...plan.problem import Problem
from .common import mean_comm, mean_costs, run_solver
from .metf import ETFEngine

NAME = "m-sct"


def favorite_lp(problem: Problem, time_limit_s: float = 60.0) -> tuple[np.ndarray, dict]:
    """Solve the favourite-child LP; returns ``(x per edge, info)`` (``x`` near 0 = favourite).

    Raises
    ------
    SolverError
        If the LP solver is missing, crashes, or does not reach an optimum in time.

    Examples
    --------
    >>> from tvm_pesto.bench.random_dag import dnn_like_problem
    >>> problem = dnn_like_problem(12, cluster="2xV100-nvlink")   # 12 ops, 2 GPUs
    >>> xs, info = favorite_lp(problem)
    >>> xs.shape == (len(problem.src),), info["lp_status"]   # one x per edge
    (True, 'Optimal')
    """
    import pulp

    # lazy: PuLP only when the LP is asked for
    from ..mip import lp_backend

    n, m = problem.num_nodes, len(problem.src)
    p = mean_costs(problem)
    c = mean_comm(problem)
    lp = pulp.LpProblem("sct_favorite_child", pulp.LpMinimize)
    x = [lp.add_variable(f"x{e}", 0, 1) for e in range(m)]
    s = [lp.add_variable(f"s{v}", 0) for v in range(n)]
    w = lp.add_variable("w", 0)
    lp += w
    out_edges: list[list[int]] = [[] for _ in range(n)]
    in_edges: list[list[int]] = [[] for _ in range(n)]
    for e, (u, v) in enumerate(zip(problem.src.tolist(), problem.dst.tolist())):
        lp += s[u] - s[v] + float(c[e]) * x[e] <= -float(p[u])
        out_edges[u].append(e)
        in_edges[v].append(e)
    for v in range(n):
        if len(out_edges[v]) > 1:
            lp += pulp.lpSum(x[e] for e in out_edges[v]) >= len(out_edges[v]) - 1
        if len(in_edges[v]) > 1:
            lp += pulp.lpSum(x[e] for e in in_edges[v]) >= len(in_edges[v]) - 1
        lp += s[v] - w <= -float(p[v])
    backend = lp_backend(time_limit_s, "m-sct: the favourite-child LP", ", or use favorite='greedy'")
    try:
        status = lp.solve(backend)
    except pulp.PulpSolverError as err:
        raise SolverError(f"m-sct: the LP solver failed on the favourite-child LP ({err}); "
                          "use favorite='greedy'") from None
    if pulp.LpStatus[status] != "Optimal":
        raise SolverError(f"m-sct: the favourite-child LP ended {pulp.LpStatus[status]!r}; "
                          "use favorite='greedy' or raise time_limit_s")
    xs = np.array([xe.value() or 0.0 for xe in x], dtype=np.float64)
    return xs, {"lp_makespan_s": float(w.value() or 0.0), "lp_status": pulp.LpStatus[status],
                "lp_solver": type(backend).__name__}


def favorite_greedy(problem: Problem) -> np.ndarray:
    """A cheap stand-in for the LP: every edge is a candidate (x = 0), so the rounding's
    tie-break makes the child with the largest transfer the favourite."""
    return np.zeros(len(problem.src))


def pick_favorites(problem: Problem, xs: np.ndarray, threshold: float) -> np.ndarray:
    """Round ``xs`` into ``favorite_parent[v]`` (-1 when none), one per parent and child."""
    n = problem.num_nodes
    c = mean_comm(problem)
    fav_parent = np.full(n, -1, dtype=np.int64)
    has_child = np.zeros(n, dtype=bool)
    cand = np.flatnonzero(xs < threshold)
    for e in cand[np.lexsort((-c[cand], xs[cand]))].tolist():
        u, v = int(problem.src[e]), int(problem.dst[e])
        if has_child[u] or fav_parent[v] >= 0:
            continue
        has_child[u] = True
        fav_parent[v] = u
    return fav_parent


def _msct(problem: Problem, fav: np.ndarray, info: dict, contention: bool = True):
    engine = ETFEngine(problem, contention=contention, favorite_parent=fav)
    assignment, order, eng_info = engine.run()
    out = dict(info)
    out.update(eng_info, favorites=int((fav >= 0).sum()), favorites_followed=engine.favorite_hits)
    return assignment, order, out


def solve(problem: Problem, threshold: float = 0.5, favorite: str = "lp", lp_max_nodes: int = 5000,
          contention: bool = True, time_limit_s: float = 60.0) -> Plan:
    """Place ``problem`` with m-SCT.

    Parameters
    ----------
    problem : Problem
    threshold : float
        LP values below it make an edge a favourite-child edge (Baechi's default 0.5).
    favorite : {"lp", "greedy"}
        How favourites are chosen.
    lp_max_nodes : int
        Above this many nodes the greedy rule replaces the LP.
    contention : bool
        Model FIFO queueing on links in the estimate (as m-ETF).
    time_limit_s : float
        Time limit of the LP.

    Returns
    -------
    Plan
        ``info`` has the LP makespan, the number of favourites and how many were followed;
        ``solve_s`` includes the LP.

    Raises
    ------
    InfeasibleError
        When some node fits on no device; the message names the memory that would work.
    SolverError
        When the LP fails or an option is invalid.

    Examples
    --------
    >>> from tvm_pesto.solve import solve as run
    >>> from tvm_pesto.bench.random_dag import dnn_like_problem
    >>> problem = dnn_like_problem(12, cluster="2xV100-nvlink")   # 12 ops, 2 GPUs
    >>> plan = run(problem, "m-sct", threshold=0.5)
    >>> plan.solver, len(plan.assignment)
    ('m-sct', 12)
    """
    t0 = time.perf_counter()
    if favorite not in ("lp", "greedy"):
        raise SolverError(f"m-sct: favorite must be 'lp' or 'greedy', not {favorite!r}")
    problem.check_memory_feasible()
    info: dict = {"threshold": threshold}
    if len(problem.src) == 0:
        xs = np.ones(0)
        info["favorite"] = "none"
    elif favorite == "lp" and problem.num_nodes <= lp_max_nodes:
        xs, lp_info = favorite_lp(problem, time_limit_s)
        info.update(lp_info, favorite="lp")
    else:
        xs = favorite_greedy(problem)
        info["favorite"] = "greedy"
    fav = pick_favorites(problem, xs, threshold)
    plan = run_solver(problem, NAME, _msct, fav=fav, info=info, contention=contention)
    plan.solve_s = time.perf_counter() - t0
    return plan
