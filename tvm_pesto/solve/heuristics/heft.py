"""HEFT (Topcuoglu et al., 2002), memory-aware.

Nodes are taken in decreasing upward rank (mean cost over the devices where a node can run,
plus the longest mean cost + mean transfer path below it). Each goes to the device where it
would finish earliest, inserted into an idle gap of that device's timeline when one is long
enough, among the devices that can still hold it (:class:`~.common.MemoryState`).

A producer's output is sent once per destination device: later consumers on that device
reuse the first transfer (as in the simulator). Link contention is not modelled.
"""
from __future__ import annotations

import numpy as np

from ...plan.plan import Plan
from ...plan.problem import Problem
from .common import GraphArrays, MemoryState, NoFit, order_by_start, run_solver, upward_rank

NAME = "heft"


class Timeline:
    """Busy slots of one device, sorted and non-overlapping, in growable numpy arrays."""

    def __init__(self, capacity: int = 64):
        self.starts = np.empty(capacity)
        self.ends = np.empty(capacity)
        self.size = 0

    def earliest(self, ready: float, dur: float, insertion: bool = True) -> tuple[float, int]:
        """Earliest start >= ``ready`` of a ``dur``-long job, and the slot index it takes.

        Examples
        --------
        >>> tl = Timeline(); tl.insert(0, 0.0, 2.0); tl.insert(1, 5.0, 6.0)
        >>> tl.earliest(1.0, 3.0)
        (2.0, 1)
        >>> tl.earliest(1.0, 3.5)
        (6.0, 2)
        """
        m = self.size
        if m == 0:
            return ready, 0
        ends = self.ends[:m]
        if not insertion:
            return max(ready, float(ends[-1])), m
        i = int(ends.searchsorted(ready, side="left"))
        if i < m:
            # gap j (before slot j) opens at max(ready, end of slot j-1) and closes at start j
            starts = self.starts[i:m]
            opens = np.empty(m - i)
            opens[0] = max(ready, float(self.ends[i - 1])) if i > 0 else ready
            if m - i > 1:
                np.maximum(self.ends[i:m - 1], ready, out=opens[1:])
            fits = (opens + dur) <= starts
            j = int(fits.argmax())
            if fits[j]:
                return float(opens[j]), i + j
        return max(ready, float(ends[-1])), m

    def insert(self, i: int, start: float, end: float) -> None:
        m = self.size
        if m == len(self.starts):
            self.starts = np.concatenate([self.starts, np.empty(m)])
            self.ends = np.concatenate([self.ends, np.empty(m)])
        self.starts[i + 1:m + 1] = self.starts[i:m].copy()
        self.ends[i + 1:m + 1] = self.ends[i:m].copy()
        self.starts[i], self.ends[i] = start, end
        self.size = m + 1


def data_ready(v: int, arrays: GraphArrays, dev: np.ndarray, finish: np.ndarray, sent: np.ndarray,
               arrival: np.ndarray, latency: np.ndarray, inv_bw: np.ndarray, d: int) -> np.ndarray:
    """Time every input of ``v`` could be on each device (reusing transfers already sent)."""
    ready = np.zeros(d)
    for u, b in arrays.preds[v]:
        du = dev[u]
        arr = finish[u] + latency[du] + b * inv_bw[du]
        reuse = sent[u] >= b
        if reuse.any():
            arr = np.where(reuse, arrival[u], arr)
        arr[du] = finish[u]
        np.maximum(ready, arr, out=ready)
    return ready


def _apply_pins(v: int, ok: np.ndarray, pins: dict, reserved: np.ndarray, st: MemoryState) -> np.ndarray:
    """Devices ``v`` may take: its pin if it has one that fits; a node without a pin (and not
    tied to a placed co-location group) keeps off the pinned devices while others fit."""
    if v in pins and ok[pins[v]]:
        only = np.zeros_like(ok)
        only[pins[v]] = True
        return only
    if v not in pins and st.pinned(v) < 0:
        free = ok & ~reserved
        if free.any():
            return free
    return ok


def _heft(problem: Problem, insertion: bool = True, pins: dict | None = None):
    n, d = problem.num_nodes, problem.num_devices
    g = GraphArrays(problem)
    st = MemoryState(problem, g)
    rank = upward_rank(problem, g)
    order = sorted(range(n), key=lambda v: (-rank[v], g.pos[v]))
    costs = problem.costs
    lat, inv = problem.latency, problem.inv_bw
    start = np.zeros(n)
    finish = np.zeros(n)
    sent = np.full((n, d), -1.0)
    arrival = np.zeros((n, d))
    timelines = [Timeline() for _ in range(d)]
    reserved = np.zeros(d, dtype=bool)
    if pins:
        reserved[list(set(pins.values()))] = True
    for v in order:
        ok = st.fits(v)
        if not ok.any():
            raise NoFit(v)
        if pins:
            ok = _apply_pins(v, ok, pins, reserved, st)
        ready = data_ready(v, g, st.dev, finish, sent, arrival, lat, inv, d)
        best_t, best_f, best_d, best_i = 0.0, np.inf, -1, 0
        for k in np.flatnonzero(ok).tolist():
            t, i = timelines[k].earliest(float(ready[k]), float(costs[v, k]), insertion)
            f = t + costs[v, k]
            if f < best_f:
                best_t, best_f, best_d, best_i = t, f, k, i
        st.place(v, best_d)
        start[v], finish[v] = best_t, best_f
        timelines[best_d].insert(best_i, best_t, best_f)
        for u, b in g.preds[v]:
            du = st.dev[u]
            if du != best_d and sent[u, best_d] < b:
                sent[u, best_d] = b
                arrival[u, best_d] = finish[u] + lat[du, best_d] + b * inv[du, best_d]
    assignment = st.dev.astype(np.int32)
    plan_order = order_by_start(assignment, start, g.pos, d)
    info = {"estimated_makespan_s": float(finish.max()) if n else 0.0, "insertion": insertion,
            "peak_memory_bytes": st.peak().tolist()}
    return assignment, plan_order, info


def solve(problem: Problem, insertion: bool = True, pins: dict | None = None) -> Plan:
    """Place ``problem`` with memory-aware HEFT.

    Parameters
    ----------
    problem : Problem
    insertion : bool
        Let a node use an idle gap between two already-scheduled nodes (classic HEFT).
    pins : dict, optional
        ``{node: device}`` for nodes that go to a given device whenever it can hold them
        (e.g. a critical path cut into runs, see :func:`tvm_pesto.solve.placement_ilp.polish.critical_path_splits`);
        the other nodes keep off the pinned devices while another device can take them.

    Returns
    -------
    Plan
        ``info["estimated_makespan_s"]`` is HEFT's own estimate (no link contention).

    Raises
    ------
    InfeasibleError
        When some node fits on no device; the message names the memory that would work.

    Examples
    --------
    >>> from tvm_pesto.solve import solve as run
    >>> from tvm_pesto.bench.random_dag import dnn_like_problem
    >>> problem = dnn_like_problem(12, cluster="2xV100-nvlink")   # 12 ops, 2 GPUs
    >>> plan = run(problem, "heft")
    >>> plan.solver, len(plan.assignment)
    ('heft', 12)
    """
    return run_solver(problem, NAME, _heft, insertion=insertion, pins=pins)
