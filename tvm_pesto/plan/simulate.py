"""Replay a plan on a cluster: makespan, per-device busy time, memory, transfers.

The work is done by the C++ core (``tvm_pesto._core``); :mod:`.reference` is the
pure-Python specification it is tested against, and is used only when the core is not
built (a source checkout without ``pip install``), with a warning.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from ..errors import InfeasibleError
from .plan import Plan
from .problem import Problem
from .reference import simulate_reference


@dataclass
class SimResult:
    """What a simulated run of a plan looks like.

    ``transfers`` has one row per cross-device transfer:
    ``(producer, src_dev, dst_dev, start_s, end_s, bytes)``.
    """

    start: np.ndarray
    finish: np.ndarray
    makespan: float
    busy: np.ndarray
    peak_memory: np.ndarray
    transfers: np.ndarray

    def utilization(self) -> np.ndarray:
        return self.busy / self.makespan if self.makespan > 0 else np.zeros_like(self.busy)

    def summary(self) -> dict:
        return {
            "makespan_s": float(self.makespan),
            "busy_s": self.busy.tolist(),
            "peak_memory_bytes": self.peak_memory.tolist(),
            "num_transfers": int(len(self.transfers)),
            "transfer_bytes": float(self.transfers[:, 5].sum()) if len(self.transfers) else 0.0,
        }


_warned = False


def _core():
    try:
        from .. import _core  # type: ignore[attr-defined]

        return _core
    except ImportError:
        return None


def simulate(problem: Problem, plan: Plan, check_memory: bool = True) -> SimResult:
    """Simulate ``plan`` for ``problem``.

    Raises
    ------
    PlanError
        If the plan is malformed or deadlocks.
    InfeasibleError
        If ``check_memory`` and a device's memory use exceeds its capacity.
    """
    global _warned
    n, d = problem.num_nodes, problem.num_devices
    plan.validate(n, d)
    cost = problem.costs[np.arange(n), plan.assignment] if n else np.zeros(0)
    if n and not np.isfinite(cost).all():
        bad = int(np.flatnonzero(~np.isfinite(cost))[0])
        raise InfeasibleError(f"the plan puts node {bad} ({problem.graph.nodes[bad].name}) on device "
                              f"{plan.assignment[bad]}, where it cannot run")
    core = _core()
    args = (n, problem.src, problem.dst, problem.ebytes, plan.assignment, plan.order, cost,
            problem.latency, problem.inv_bw, problem.mem, d, problem.hosts)
    if core is not None:
        start, finish, busy, peak, transfers = core.simulate(*args)
    else:
        if not _warned:
            warnings.warn("tvm_pesto._core is not built; using the slow Python reference simulator "
                          "(run `pip install .` to build it)", RuntimeWarning, stacklevel=2)
            _warned = True
        start, finish, busy, peak, transfers = simulate_reference(*args)
    makespan = float(finish.max()) if n else 0.0
    res = SimResult(start, finish, makespan, busy, peak, transfers)
    if check_memory:
        over = np.flatnonzero(peak > problem.capacity * (1 + 1e-9))
        if len(over):
            k = int(over[0])
            raise InfeasibleError(
                f"plan by {plan.solver} needs {peak[k] / 2**20:.1f} MiB on device {k} "
                f"({problem.cluster.devices[k].name}), which holds {problem.capacity[k] / 2**20:.1f} MiB")
    return res
