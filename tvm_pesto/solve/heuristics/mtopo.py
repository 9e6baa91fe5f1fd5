"""m-TOPO: memory-constrained topological placement (Baechi, SoCC'20).

Walk the graph in topological order and fill the devices one after the other: a device
takes nodes until it reaches its share, then the next device starts. The share of device
``k`` is bounded by

* memory: ``total weights+outputs / devices + largest node`` (Baechi's uniform share), and
* compute: ``speed_k / sum(speed)`` of the total work, where a device's speed is the median
  over nodes of ``fastest cost / cost on k`` (so a slow CPU next to accelerators gets a small
  share).

The last device takes whatever is left. Hard limits always apply: a node only goes where it
can run, where it fits (:class:`~.common.MemoryState`), and with its co-location group.
Each device runs its nodes in topological order.
"""
from __future__ import annotations

import numpy as np

from ...errors import SolverError
from ...plan.plan import Plan
from ...plan.problem import Problem
from .common import GraphArrays, MemoryState, NoFit, run_solver

NAME = "m-topo"
SHARES = ("both", "memory", "compute")


def device_speeds(problem: Problem) -> np.ndarray:
    """Relative speed of each device: median over nodes of ``min cost / cost on device``."""
    c = problem.costs
    best = c.min(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(np.isfinite(c) & (c > 0), best / c, np.nan)
        ratio = np.where(np.isfinite(c) & (c == 0), 1.0, ratio)
    speeds = np.array([np.nanmedian(col) if np.isfinite(col).any() else 0.0 for col in ratio.T])
    return np.nan_to_num(speeds, nan=0.0)


def _mtopo(problem: Problem, share: str = "both"):
    if share not in SHARES:
        raise SolverError(f"m-topo: unknown share {share!r}; use one of {', '.join(SHARES)}")
    n, d = problem.num_nodes, problem.num_devices
    g = GraphArrays(problem)
    st = MemoryState(problem, g)
    mem = problem.mem
    mem_share = np.full(d, mem.sum() / d + (mem.max() if n else 0.0))
    speeds = device_speeds(problem)
    work = problem.min_cost()
    total_work = float(work.sum())
    work_share = total_work * speeds / speeds.sum() if speeds.sum() > 0 else np.full(d, total_work / d)
    use_mem = share in ("both", "memory")
    use_work = share in ("both", "compute")
    dev_mem = np.zeros(d)
    dev_work = np.zeros(d)
    cur = 0
    for v in g.topo:
        ok = st.fits(v)
        if not ok.any():
            raise NoFit(v)
        pin = st.pinned(v)
        if pin >= 0:
            k = pin
        else:
            # move on when the current device reached its share (the last one takes the rest)
            while cur < d - 1 and (
                    (use_mem and dev_mem[cur] > 0 and dev_mem[cur] + mem[v] > mem_share[cur])
                    or (use_work and dev_work[cur] > 0 and dev_work[cur] + work[v] > work_share[cur] * (1 + 1e-9))
                    or (dev_mem[cur] == 0 and dev_work[cur] == 0 and speeds[cur] == 0)):
                cur += 1
            if ok[cur]:
                k = cur
            else:
                later = [c for c in range(cur, d) if ok[c]]
                k = later[0] if later else int(np.flatnonzero(ok)[np.argmin(problem.costs[v, ok])])
        st.place(v, k)
        dev_mem[k] += mem[v]
        dev_work[k] += work[v]
    assignment = st.dev.astype(np.int32)
    order: list[list[int]] = [[] for _ in range(d)]
    for v in g.topo:
        order[assignment[v]].append(v)
    info = {"share": share, "memory_share_bytes": mem_share.tolist(), "work_share_s": work_share.tolist(),
            "peak_memory_bytes": st.peak().tolist()}
    return assignment, order, info


def solve(problem: Problem, share: str = "both") -> Plan:
    """Place ``problem`` with m-TOPO.

    Parameters
    ----------
    problem : Problem
    share : {"both", "memory", "compute"}
        Which share ends a device's turn: Baechi's memory share, a compute share by device
        speed, or whichever comes first.

    Returns
    -------
    Plan

    Raises
    ------
    InfeasibleError
        When some node fits on no device; the message names the memory that would work.

    Examples
    --------
    >>> from tvm_pesto.solve import solve as run
    >>> from tvm_pesto.bench.random_dag import dnn_like_problem
    >>> problem = dnn_like_problem(12, cluster="2xV100-nvlink")   # 12 ops, 2 GPUs
    >>> plan = run(problem, "m-topo", share="memory")
    >>> plan.solver, len(plan.assignment)
    ('m-topo', 12)
    """
    return run_solver(problem, NAME, _mtopo, share=share)
