"""Shared machinery of the placement heuristics: memory bookkeeping, co-location, priorities.

Every heuristic places nodes in a topological order (each node after all its producers),
so the memory a node adds to a device is known exactly when it is placed:

* its own weights and outputs (``problem.mem[v]``), and
* for every producer ``u`` on another device, the growth of the copy of ``u``'s output
  that the device holds: the memory model keeps one copy per (producer, device), as large
  as the largest edge from ``u`` to a node on that device.

That is the memory model of :mod:`tvm_pesto.plan.simulate`, so a placement the
:class:`MemoryState` accepts never exceeds a device's capacity in simulation.

Co-location groups are placed as a unit: when the first member of a group is placed, the
weights and outputs of all members are reserved on its device, and the other members are
pinned there.
"""
from __future__ import annotations

import copy
import time
from typing import Callable

import networkx as nx
import numpy as np

from ...errors import InfeasibleError, SolverError
from ...plan.plan import Plan
from ...plan.problem import Problem

MiB = float(1 << 20)
_TOL = 1e-9  # relative slack on capacities, as in the simulator's check


class NoFit(Exception):
    """Internal: a heuristic ran out of device memory. Turned into InfeasibleError."""

    def __init__(self, node: int, reason: str = ""):
        super().__init__(node, reason)
        self.node = node
        self.reason = reason


class GraphArrays:
    """Predecessor/successor lists of a problem's graph, as Python lists for fast loops.

    ``preds[v]`` is a list of ``(u, bytes)``; ``succs[u]`` a list of ``(v, bytes)``;
    ``topo`` a topological order and ``pos[v]`` the position of ``v`` in it.
    """

    def __init__(self, problem: Problem):
        n = problem.num_nodes
        self.n = n
        self.preds: list[list[tuple[int, float]]] = [[] for _ in range(n)]
        self.succs: list[list[tuple[int, float]]] = [[] for _ in range(n)]
        for u, v, b in zip(problem.src.tolist(), problem.dst.tolist(), problem.ebytes.tolist()):
            self.preds[v].append((u, b))
            self.succs[u].append((v, b))
        self.topo = problem.graph.topo_order()
        self.pos = np.empty(n, dtype=np.int64)
        self.pos[self.topo] = np.arange(n)


def colocation_index(problem: Problem) -> tuple[np.ndarray, list[list[int]]]:
    """Merge overlapping co-location groups; returns ``(group_of[n], groups)``.

    ``group_of[v]`` is -1 for a node in no group (or in a group of one).
    """
    n = problem.num_nodes
    uf = nx.utils.UnionFind()
    for grp in problem.colocate:
        grp = [int(v) for v in grp]
        if len(grp) > 1:
            uf.union(*grp)
    group_of = np.full(n, -1, dtype=np.int64)
    groups: list[list[int]] = []
    for members in uf.to_sets():
        members = sorted(members)
        if len(members) < 2:
            continue
        for v in members:
            group_of[v] = len(groups)
        groups.append(members)
    return group_of, groups


class MemoryState:
    """Device memory in use during a topological placement, plus co-location pins.

    When the first member of a co-location group is placed, the weights and outputs of the
    whole group are reserved on its device, and, when the device has room, also every input
    the other members could receive from outside the group (their *slack*). A later member
    then only turns its slack into what it really receives, so it always fits. When no
    device has room for the slack, the group is placed without it, and a later member may
    find its device full (the heuristic then reports that the problem does not fit).

    Parameters
    ----------
    problem : Problem
    arrays : GraphArrays, optional
        Reused when the caller already built them.

    Raises
    ------
    InfeasibleError
        If a co-location group has no device on which all its members can run.

    Examples
    --------
    >>> from tvm_pesto.bench.random_dag import dnn_like_problem
    >>> problem = dnn_like_problem(12, cluster="2xV100-nvlink")   # 12 ops, 2 GPUs
    >>> st = MemoryState(problem)
    >>> mask = st.fits(0)      # the devices node 0 fits on now
    >>> st.place(0, int(np.argmax(mask)))
    >>> bool(st.peak().max() > 0)
    True
    """

    def __init__(self, problem: Problem, arrays: GraphArrays | None = None):
        self.problem = problem
        self.g = arrays or GraphArrays(problem)
        n, d = problem.num_nodes, problem.num_devices
        self.n, self.d = n, d
        self.mem = problem.mem
        self.cap = problem.capacity * (1.0 + _TOL)
        self.used = np.zeros(d)
        self.dev = np.full(n, -1, dtype=np.int64)
        self.recv = np.zeros((n, d))  # bytes of u's output held on device d (u elsewhere)
        self.allowed = np.isfinite(problem.costs)
        self.group_of, self.groups = colocation_index(problem)
        self.group_dev = np.full(len(self.groups), -1, dtype=np.int64)
        self.group_mem = np.array([self.mem[g].sum() for g in self.groups], dtype=np.float64)
        # inputs a member may receive from outside its group (worst case), and whether the
        # member's slack is currently reserved on its group's device
        self.slack = np.zeros(n)
        self.slack_reserved = np.zeros(n, dtype=bool)
        self.group_slack = np.zeros(len(self.groups))
        for gi, members in enumerate(self.groups):
            ok = self.allowed[members].all(axis=0)
            if not ok.any():
                names = ", ".join(problem.graph.nodes[v].name for v in members[:6])
                raise InfeasibleError(
                    f"{problem.graph.name}: co-location group [{names}{', ...' if len(members) > 6 else ''}] "
                    f"has no device of {problem.cluster.name} on which all its members can run; "
                    "drop the group or give its members a common device")
            self.allowed[members] = ok
            inside = set(members)
            for v in members:
                self.slack[v] = sum(b for u, b in self.g.preds[v] if u not in inside)
            self.group_slack[gi] = self.slack[members].sum()

    # -- queries ---------------------------------------------------------------------------
    def pinned(self, v: int) -> int:
        """Device ``v`` must go to because its group is placed, else -1."""
        gi = self.group_of[v]
        return int(self.group_dev[gi]) if gi >= 0 else -1

    def received(self, v: int) -> np.ndarray:
        """Bytes each device would have to add to hold ``v``'s inputs from other devices."""
        extra = np.zeros(self.d)
        for u, b in self.g.preds[v]:
            du = self.dev[u]
            if du < 0:
                raise SolverError(f"internal: node {v} placed before its producer {u}")
            r = np.maximum(b - self.recv[u], 0.0)
            r[du] = 0.0
            extra += r
        return extra

    def _needs(self, v: int) -> tuple[np.ndarray, np.ndarray | None]:
        """(tight, safe) bytes placing ``v`` adds on each device; ``inf`` where it may not go.

        ``safe`` is None except for the first member of a group, where it also reserves the
        other members' slack.
        """
        extra = self.received(v)
        gi = self.group_of[v]
        safe = None
        if gi < 0:
            extra += self.mem[v]
        elif self.group_dev[gi] < 0:
            extra += self.group_mem[gi]
            safe = extra + (self.group_slack[gi] - self.slack[v])
            safe[~self.allowed[v]] = np.inf
        else:
            pin = np.full(self.d, np.inf)
            pin[self.group_dev[gi]] = -self.slack[v] if self.slack_reserved[v] else 0.0
            extra += pin
        extra[~self.allowed[v]] = np.inf
        return extra, safe

    def need(self, v: int) -> np.ndarray:
        """Bytes placing ``v`` adds on each device (``inf`` where it may not go); negative
        when a member gives back more reserved slack than it receives."""
        return self._needs(v)[0]

    def fits(self, v: int) -> np.ndarray:
        """Boolean mask of devices that can take ``v`` now.

        For the first member of a co-location group, devices with room for the whole group
        and its slack are preferred; when there is none, any device that holds the group's
        weights and outputs is accepted.
        """
        tight, safe = self._needs(v)
        if safe is not None:
            ok_safe = self.used + safe <= self.cap
            if ok_safe.any():
                return ok_safe
        return self.used + tight <= self.cap

    def fits_one(self, v: int, k: int) -> bool:
        """Whether device ``k`` can take ``v`` now (same answer as ``fits(v)[k]``, faster)."""
        gi = self.group_of[v]
        if gi >= 0 and self.group_dev[gi] < 0:
            return bool(self.fits(v)[k])
        if not self.allowed[v, k]:
            return False
        if gi >= 0:
            if self.group_dev[gi] != k:
                return False
            need = -self.slack[v] if self.slack_reserved[v] else 0.0
        else:
            need = self.mem[v]
        dev, recv = self.dev, self.recv
        for u, b in self.g.preds[v]:
            if dev[u] != k:
                have = recv[u, k]
                if b > have:
                    need += b - have
        return bool(self.used[k] + need <= self.cap[k])

    # -- updates ---------------------------------------------------------------------------
    def place(self, v: int, dv: int) -> None:
        """Put ``v`` on device ``dv`` (the caller checked :meth:`fits`)."""
        tight, safe = self._needs(v)
        if not np.isfinite(tight[dv]):
            raise SolverError(f"internal: node {v} placed on device {dv}, where it may not go")
        gi = self.group_of[v]
        first = gi >= 0 and self.group_dev[gi] < 0
        if first and safe is not None and self.used[dv] + safe[dv] <= self.cap[dv]:
            self.used[dv] += safe[dv]
            for w in self.groups[gi]:
                self.slack_reserved[w] = w != v
        else:
            self.used[dv] += tight[dv]
        self.slack_reserved[v] = False
        for u, b in self.g.preds[v]:
            if self.dev[u] != dv and b > self.recv[u, dv]:
                self.recv[u, dv] = b
        self.dev[v] = dv
        if first:
            self.group_dev[gi] = dv

    def peak(self) -> np.ndarray:
        """Bytes in use (and reserved) on each device; once every node is placed this equals
        the simulator's peak for the same placement."""
        return self.used.copy()


def mean_costs(problem: Problem) -> np.ndarray:
    """Mean of each node's finite costs."""
    c = problem.costs
    fin = np.isfinite(c)
    return np.where(fin, c, 0.0).sum(axis=1) / np.maximum(fin.sum(axis=1), 1)


def mean_comm(problem: Problem) -> np.ndarray:
    """Mean transfer time of each edge over ordered pairs of distinct devices."""
    d = problem.num_devices
    if d < 2 or len(problem.ebytes) == 0:
        return np.zeros(len(problem.ebytes))
    off = ~np.eye(d, dtype=bool)
    lat = problem.latency[off].mean()
    inv = problem.inv_bw[off].mean()
    return lat + problem.ebytes * inv


def upward_rank(problem: Problem, arrays: GraphArrays, with_comm: bool = True) -> np.ndarray:
    """HEFT's upward rank: mean cost plus the longest (mean cost + mean transfer) path below."""
    w = mean_costs(problem)
    d = problem.num_devices
    lat = inv = 0.0
    if with_comm and d > 1:
        off = ~np.eye(d, dtype=bool)
        lat, inv = float(problem.latency[off].mean()), float(problem.inv_bw[off].mean())
    rank = w.copy()
    for u in reversed(arrays.topo):
        best = 0.0
        for v, b in arrays.succs[u]:
            val = rank[v] + (lat + b * inv if with_comm and d > 1 else 0.0)
            if val > best:
                best = val
        rank[u] = w[u] + best
    return rank


def order_by_start(assignment: np.ndarray, start: np.ndarray, pos: np.ndarray, d: int) -> list[list[int]]:
    """Per-device orders sorted by (computed start time, topological position).

    With start times from a schedule that respects the dependencies, this order cannot
    deadlock: every wait (for a producer or for an earlier node on the device) points to a
    node with a smaller key.
    """
    keys = np.lexsort((pos, start))
    order: list[list[int]] = [[] for _ in range(d)]
    for v in keys.tolist():
        order[int(assignment[v])].append(v)
    return order


def _scaled(problem: Problem, factor: float) -> Problem:
    p = copy.copy(problem)
    p.capacity = problem.capacity * factor
    return p


def memory_lower_bound_factor(problem: Problem) -> float:
    """Smallest factor by which every device's memory must grow for any placement to fit.

    Two necessary conditions: the total of weights and outputs fits in the total memory,
    and the largest co-location group (or node) fits on the largest device it may use.
    """
    cap = problem.capacity
    f = float(problem.mem.sum() / cap.sum()) if cap.sum() > 0 else np.inf
    group_of, groups = colocation_index(problem)
    allowed = np.isfinite(problem.costs)
    units = [[v] for v in range(problem.num_nodes) if group_of[v] < 0] + groups
    for members in units:
        ok = allowed[members].all(axis=0)
        if ok.any():
            f = max(f, float(problem.mem[members].sum() / cap[ok].max()))
    return f


def _fmt_mib(x: float) -> str:
    """Bytes in a readable unit (``1.5 GiB``, ``300.0 MiB``, ``12.0 KiB``, ``100 B``)."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if x >= size:
            return f"{x / size:.1f} {unit}"
    return f"{x:.0f} B"


def infeasible_error(problem: Problem, name: str, core: Callable, opts: dict, err: NoFit,
                     max_tries: int = 12) -> InfeasibleError:
    """Build the error for a heuristic that found no placement within device memory.

    It names a necessary capacity (a bound) and a sufficient one (the smallest the same
    heuristic succeeds with, found by bisection on a uniform scale of every device's memory).
    """
    cap = problem.capacity
    uniform = bool(np.allclose(cap, cap[0]))
    raw_lb = memory_lower_bound_factor(problem)
    lb = max(1.0, raw_lb)
    lo, hi = lb, max(lb, 1.0) * 1.25
    ok_factor = None
    tries = 0
    deadline = time.perf_counter() + 30.0
    while tries < max_tries and time.perf_counter() < deadline:
        tries += 1
        try:
            core(_scaled(problem, hi), **opts)
            ok_factor = hi
            break
        except NoFit:
            lo, hi = hi, hi * 2.0
    if ok_factor is not None:
        for _ in range(max_tries):
            if time.perf_counter() > deadline or (ok_factor - lo) <= 0.02 * ok_factor:
                break
            mid = 0.5 * (lo + ok_factor)
            try:
                core(_scaled(problem, mid), **opts)
                ok_factor = mid
            except NoFit:
                lo = mid
    node = problem.graph.nodes[err.node].name if 0 <= err.node < problem.num_nodes else str(err.node)
    head = (f"{problem.graph.name}: {name} found no placement within the memory of {problem.cluster.name} "
            f"(node {node} fits on no device{': ' + err.reason if err.reason else ''}). ")
    if uniform:
        if raw_lb > 1.0:
            bound = (f"at least {_fmt_mib(lb * cap[0])} per device is needed (a bound from the total and "
                     "the largest co-located group)")
        else:
            bound = ("that meets the simple bounds (total, largest co-located group), so the tensors "
                     "copied between devices are what overflows")
        if ok_factor is not None:
            good = f"{name} succeeds with {_fmt_mib(ok_factor * cap[0])} per device"
            fix = f"use devices with at least {_fmt_mib(ok_factor * cap[0])} each, or more devices"
        else:
            good = f"{name} did not succeed even with {_fmt_mib(hi * cap[0])} per device"
            fix = "use more devices or another solver"
        return InfeasibleError(f"{head}Devices hold {_fmt_mib(cap[0])} each; {bound}; {good}. Fix: {fix}.")
    bound = (f"every device's memory must grow by at least x{lb:.2f} (a bound)" if raw_lb > 1.0 else
             "the simple bounds (total, largest co-located group) are met, so the tensors copied between "
             "devices are what overflows")
    if ok_factor is not None:
        good = (f"{name} succeeds when every device's memory is scaled by x{ok_factor:.2f} "
                f"(smallest device {_fmt_mib(ok_factor * cap.min())})")
    else:
        good = f"{name} did not succeed even at x{hi:.2f}"
    return InfeasibleError(f"{head}{bound}; {good}. Fix: use larger or more devices.")


def run_solver(problem: Problem, name: str, core: Callable, **opts) -> Plan:
    """Run a heuristic's core and wrap its result as a :class:`Plan`.

    ``core(problem, **opts)`` returns ``(assignment, order, info)`` or raises :class:`NoFit`.
    """
    t0 = time.perf_counter()
    problem.check_memory_feasible()
    try:
        assignment, order, info = core(problem, **opts)
    except NoFit as err:
        raise infeasible_error(problem, name, core, opts, err) from None
    solve_s = time.perf_counter() - t0
    return Plan(np.asarray(assignment, dtype=np.int32), order, solver=name, solve_s=solve_s, info=info)
