"""The error ``tvm-pesto place`` raises for a placement problem that does not fit in its
devices' memory: the reason, a bound, and the smallest memory with which a plan is found.
"""
from __future__ import annotations

import copy
import math
import time

import numpy as np

from ..errors import InfeasibleError, PestoError
from ..plan import simulate
from ..plan.objective import evaluate
from ..solve import solve
from ..solve.heuristics.common import memory_lower_bound_factor


def memory_error(problem, err: InfeasibleError, reason: str, model: str, objective: str,
                 microbatches: int | None) -> InfeasibleError:
    """The error for a problem that does not fit: a bound, and the smallest uniform scale
    of every device's memory (bisection) with which a heuristic finds a plan, judged in
    ``model`` on ``objective`` (:mod:`tvm_pesto.plan.objective`). ``err`` is returned
    unchanged when even ample memory does not help (e.g. co-location)."""
    cap = problem.capacity

    def works(f: float) -> bool:
        p = copy.copy(problem)
        p.capacity = cap * f
        for name in ("heft", "m-etf", "m-topo", "single", "m-sct") if model == "op" else ("stage-dp",):
            try:
                plan = solve(p, name, model=model, objective=objective, microbatches=microbatches)
                if model == "op":
                    simulate(p, plan)
                    return True
                if evaluate(p, plan, model, objective, microbatches).valid:
                    return True
            except PestoError:
                continue
        return False

    lo = max(1.0, memory_lower_bound_factor(problem))
    hi = max(lo, float(problem.mem.sum() + problem.ebytes.sum()) / float(cap.min())) * 1.01
    if not works(hi):
        return err
    deadline = time.perf_counter() + 60.0
    while hi - lo > 1e-3 * hi and time.perf_counter() < deadline:
        mid = math.sqrt(lo * hi) if hi > 2 * lo else 0.5 * (lo + hi)
        if works(mid):
            hi = mid
        else:
            lo = mid
    need = memory_lower_bound_factor(problem)  # necessary for any plan
    mib = lambda x: math.ceil(x / 2**20 * 10) / 10  # noqa: E731 - round up, so the figure works
    if np.allclose(cap, cap[0]):
        return InfeasibleError(
            f"{reason}. The smallest memory per device with which a plan fits is {mib(hi * cap[0]):.1f} MiB "
            f"(devices of {problem.cluster.name} hold {mib(cap[0]):.1f} MiB; no plan can use less than "
            f"{mib(need * cap[0]):.1f} MiB each). Fix: use devices with at least {mib(hi * cap[0]):.1f} MiB "
            f"each, or more devices")
    return InfeasibleError(
        f"{reason}. A plan fits when every device's memory is scaled by x{math.ceil(hi * 1000) / 1000:.3f} "
        f"(smallest device then {mib(hi * cap.min()):.1f} MiB). Fix: use larger or more devices")


__all__ = ["memory_error"]
