"""A warm start for the placement ILP: a simulated plan's values for every model variable.

:func:`tvm_pesto.solve.placement_ilp.model.build.build_ilp` calls :func:`set_warm_values` when it is given a
warm start, so the MIP solver starts from that plan (``setInitialValue``).
"""
from __future__ import annotations

import numpy as np
import pulp

from ....plan import Plan, Problem


def transfer_values(problem: Problem, plan: Plan, sim, producers_dest: dict[int, list[int]]) -> dict:
    """Warm values (seconds/bytes) of ``T``, ``dur``, ``act``, ``r`` from a simulated plan.

    Returns
    -------
    dict
        ``(producer, destination device)`` -> ``(start, duration, active, bytes)``, for each
        destination in ``producers_dest[producer]``.
    """
    tx = {(int(row[0]), int(row[2])): (row[3], row[4], row[5]) for row in sim.transfers}
    vals = {}
    for a, seq in enumerate(plan.order):
        for e in range(problem.num_devices):
            running = 0.0
            for u in seq:
                if e not in producers_dest.get(u, ()):
                    continue
                if (u, e) in tx:
                    s, _end, b = tx[(u, e)]
                    dur = problem.transfer_s(a, e, b)
                    vals[(u, e)] = (float(s), float(dur), 1.0, float(b))
                    running = max(running, s + dur)
                else:
                    vals[(u, e)] = (max(float(sim.finish[u]), running), 0.0, 0.0, 0.0)
    return vals


def _init(var: pulp.LpVariable, value: float) -> None:
    """setInitialValue, clipped into the variable's bounds (float noise of the simulator)."""
    if var.lowBound is not None:
        value = max(value, var.lowBound)
    if var.upBound is not None:
        value = min(value, var.upBound)
    var.setInitialValue(value)


def set_warm_values(problem: Problem, plan: Plan, sim, V, dest: dict[int, list[int]]) -> None:
    """Give every variable of ``V`` (an :class:`~tvm_pesto.solve.placement_ilp.model.build.IlpVars`) its value
    in ``plan``, whose schedule is ``sim``; ``dest`` maps each producer to the devices its
    transfer variables exist for."""
    ts, bs = V.time_scale, V.byte_scale
    n, D = problem.num_nodes, problem.num_devices
    a = plan.assignment
    for v in range(n):
        for d in range(D):
            _init(V.x[v, d], 1.0 if a[v] == d else 0.0)
        _init(V.S[v], float(sim.start[v]) * ts)
        _init(V.C[v], float(sim.finish[v]) * ts)
    _init(V.M, float(sim.makespan) * ts)
    pos = np.zeros(n, dtype=np.int64)
    for seq in plan.order:
        for k, v in enumerate(seq):
            pos[v] = k
    for (u, e), (s, dur, act, b) in transfer_values(problem, plan, sim, dest).items():
        _init(V.T[u, e], s * ts)
        _init(V.dur[u, e], dur * ts)
        _init(V.act[u, e], act)
        if (u, e) in V.r:
            _init(V.r[u, e], b * bs)
    for (u, w), var in V.same.items():
        _init(var, 1.0 if a[u] == a[w] else 0.0)
    for (p, q), var in V.y.items():
        before = pos[p] < pos[q] if a[p] == a[q] else sim.start[p] <= sim.start[q]
        _init(var, 1.0 if before else 0.0)
    if V.B is not None:
        tv = transfer_values(problem, plan, sim, dest)
        busy = np.zeros(D)
        np.add.at(busy, a, problem.costs[np.arange(n), a])
        link = np.zeros((D, D))
        for (u, a_, e), var in V.w.items():
            dur = tv.get((u, e), (0.0, 0.0, 0.0, 0.0))[1] if a[u] == a_ else 0.0
            _init(var, dur * ts)
            link[a_, e] += dur
        _init(V.B, max(busy.max(initial=0.0), link.max(initial=0.0)) * ts)


__all__ = ["set_warm_values", "transfer_values"]
