"""m-ETF: memory-constrained Earliest Time First (Baechi, SoCC'20; Hwang et al. 1989).

Repeatedly schedule the (ready node, device) pair with the earliest start time, among the
devices that can still hold the node; ties go to the node with the larger upward rank.
Transfers are sent once per (producer, device) and queue on their directed link, so the
estimate sees link contention like the simulator does.

The search is event-free: each device keeps a heap of the ready nodes it could take, keyed
by the time their inputs could be there, and a heap of those already waiting for it keyed
by priority. Picking the best pair costs O(devices) heap peeks, so 10k nodes take seconds.
The same engine runs m-SCT (:mod:`.msct`) with a favourite-child rule.
"""
from __future__ import annotations

import heapq

import numpy as np

from ...plan.plan import Plan
from ...plan.problem import Problem
from .common import GraphArrays, MemoryState, NoFit, order_by_start, run_solver, upward_rank

NAME = "m-etf"


class ETFEngine:
    """The list scheduler shared by m-ETF and m-SCT.

    Parameters
    ----------
    problem : Problem
    contention : bool
        Queue transfers on their directed link (FIFO) in the estimate.
    favorite_parent : ndarray of int, optional
        ``favorite_parent[v]`` is the node whose device ``v`` should follow on (m-SCT), or -1.
    """

    def __init__(self, problem: Problem, contention: bool = True, favorite_parent: np.ndarray | None = None):
        self.p = problem
        n, d = problem.num_nodes, problem.num_devices
        self.n, self.d = n, d
        self.g = GraphArrays(problem)
        self.st = MemoryState(problem, self.g)
        self.prio = upward_rank(problem, self.g).tolist()
        self.pos = self.g.pos.tolist()
        self.costs = problem.costs
        # plain Python containers: the hot loops below work on scalars
        self.lat = problem.latency.tolist()
        self.inv = problem.inv_bw.tolist()
        self.contention = contention
        self.fav_parent = favorite_parent
        self.dev = [-1] * n
        self.start = [0.0] * n
        self.finish = [0.0] * n
        self.free = [0.0] * d
        self.last = [-1] * d
        self.version = [0] * d
        self.fit_ver: dict[tuple[int, int], int] = {}
        self.sent: dict[tuple[int, int], float] = {}  # (producer, device) -> bytes sent
        self.arrival: dict[tuple[int, int], float] = {}
        self.link_free = [[0.0] * d for _ in range(d)]
        self.indeg = [len(p) for p in self.g.preds]
        self.done = [False] * n
        self.waiting: list[list] = [[] for _ in range(d)]
        self.avail: list[list] = [[] for _ in range(d)]
        self.dropped: list[tuple[int, int]] = []
        self.favorite_hits = 0
        self.allowed_list = [np.flatnonzero(row).tolist() for row in self.st.allowed]

    # -- times -----------------------------------------------------------------------------
    def ready_at(self, v: int, k: int) -> float:
        """When all of ``v``'s inputs could be on device ``k``, given transfers so far."""
        t = 0.0
        dev, finish, sent = self.dev, self.finish, self.sent
        for u, b in self.g.preds[v]:
            du = dev[u]
            if du == k:
                a = finish[u]
            elif sent.get((u, k), -1.0) >= b:
                a = self.arrival[(u, k)]
            else:
                a = finish[u]
                if self.contention:
                    lf = self.link_free[du][k]
                    if lf > a:
                        a = lf
                a += self.lat[du][k] + b * self.inv[du][k]
            if a > t:
                t = a
        return t

    def fits(self, v: int, k: int) -> bool:
        if self.fit_ver.get((v, k)) == self.version[k]:
            return True
        ok = self.st.fits_one(v, k)
        if ok:
            self.fit_ver[(v, k)] = self.version[k]
        return ok

    def candidates(self, v: int) -> list[int]:
        """Devices ``v`` may use (runnable there and not pinned elsewhere)."""
        pin = self.st.pinned(v)
        if pin >= 0:
            return [pin] if self.st.allowed[v, pin] else []
        return self.allowed_list[v]

    # -- heaps -----------------------------------------------------------------------------
    def push_ready(self, v: int) -> None:
        key = (-self.prio[v], self.pos[v], v)
        for k in self.candidates(v):
            heapq.heappush(self.waiting[k], (self.ready_at(v, k),) + key)

    def _usable(self, v: int, k: int) -> bool:
        if self.done[v]:
            return False
        pin = self.st.pinned(v)
        if pin >= 0 and pin != k:
            return False
        if not self.fits(v, k):
            self.dropped.append((v, k))
            return False
        return True

    def peek(self, k: int):
        """Best pair for device ``k``: ``(start, -prio, pos, v)`` or None."""
        wait, avail, free = self.waiting[k], self.avail[k], self.free[k]
        while True:
            while wait and wait[0][0] <= free:
                item = heapq.heappop(wait)
                if not self.done[item[3]]:
                    heapq.heappush(avail, item[1:])
            if avail:
                top = avail[0]
                v = top[2]
                if not self._usable(v, k):
                    heapq.heappop(avail)
                    continue
                if self.contention:
                    fresh = self.ready_at(v, k)
                    if fresh > free:
                        heapq.heappop(avail)
                        heapq.heappush(wait, (fresh,) + top)
                        continue
                return (free,) + top
            if wait:
                top = wait[0]
                v = top[3]
                if not self._usable(v, k):
                    heapq.heappop(wait)
                    continue
                if self.contention:
                    fresh = self.ready_at(v, k)
                    if fresh > top[0]:
                        heapq.heapreplace(wait, (fresh,) + top[1:])
                        continue
                return top
            return None

    # -- commit ----------------------------------------------------------------------------
    def commit(self, v: int, k: int) -> list[int]:
        """Schedule ``v`` on ``k`` after its current last node; returns newly ready nodes."""
        t = self.free[k]
        dev, finish = self.dev, self.finish
        for u, b in self.g.preds[v]:
            du = dev[u]
            if du == k:
                a = finish[u]
            else:
                key = (u, k)
                if self.sent.get(key, -1.0) < b:
                    begin = finish[u]
                    if self.contention and self.link_free[du][k] > begin:
                        begin = self.link_free[du][k]
                    end = begin + self.lat[du][k] + b * self.inv[du][k]
                    self.sent[key] = b
                    self.arrival[key] = end
                    if self.contention:
                        self.link_free[du][k] = end
                a = self.arrival[key]
            if a > t:
                t = a
        self.st.place(v, k)
        dev[v] = k
        self.done[v] = True
        self.start[v] = t
        finish[v] = t + float(self.costs[v, k])
        self.free[k] = finish[v]
        self.last[k] = v
        self.version[k] += 1
        new = []
        for w, _ in self.g.succs[v]:
            self.indeg[w] -= 1
            if self.indeg[w] == 0:
                new.append(w)
        return new

    def try_favorite(self, w: int) -> bool:
        """m-SCT rule: put ``w`` right after its favourite parent when that device is still
        at the parent and is (one of) the earliest places ``w`` could start."""
        if self.fav_parent is None:
            return False
        p = int(self.fav_parent[w])
        if p < 0 or not self.done[p]:
            return False
        k = self.dev[p]
        if self.last[k] != p:
            return False
        cand = [c for c in self.candidates(w) if self.fits(w, c)]
        if k not in cand:
            return False
        est = {c: max(self.free[c], self.ready_at(w, c)) for c in cand}
        if est[k] > min(est.values()):
            return False
        self.favorite_hits += 1
        return True

    def run(self):
        n, d = self.n, self.d
        for v in range(n):
            if self.indeg[v] == 0:
                self.push_ready(v)
        scheduled = 0
        while scheduled < n:
            best = None
            for k in range(d):
                c = self.peek(k)
                if c is not None and (best is None or c < best[0]):
                    best = (c, k)
            if best is None:
                self._retry_dropped()
                continue
            (_, _, _, v), k = best
            stack = [(v, k)]
            first = True
            while stack:
                v, k = stack.pop()
                # A favourite child was chosen before later commits; its device may no
                # longer be allowed (co-location pinned elsewhere) or have room.
                if not first and not (k in self.candidates(v) and self.fits(v, k)):
                    self.push_ready(v)
                    continue
                first = False
                new = self.commit(v, k)
                scheduled += 1
                for w in new:
                    if self.try_favorite(w):
                        stack.append((w, self.dev[int(self.fav_parent[w])]))
                    else:
                        self.push_ready(w)
        assignment = self.st.dev.astype(np.int32)
        order = order_by_start(assignment, np.asarray(self.start), self.g.pos, d)
        info = {"estimated_makespan_s": float(max(self.finish)) if n else 0.0,
                "contention": self.contention, "peak_memory_bytes": self.st.peak().tolist()}
        return assignment, order, info

    def _retry_dropped(self) -> None:
        """Nothing is placeable: re-check nodes a device turned away (inputs already held
        there can make room); if none fits anywhere, the problem does not fit."""
        pending = sorted({v for v, _ in self.dropped if not self.done[v]})
        self.dropped = []
        pushed = False
        for v in pending:
            ok = self.st.fits(v)
            key = (-self.prio[v], self.pos[v], v)
            for k in self.candidates(v):
                if ok[k]:
                    heapq.heappush(self.waiting[k], (self.ready_at(v, k),) + key)
                    pushed = True
        if not pushed:
            stuck = pending[0] if pending else self.done.index(False)
            raise NoFit(stuck)


def _metf(problem: Problem, contention: bool = True):
    return ETFEngine(problem, contention=contention).run()


def solve(problem: Problem, contention: bool = True) -> Plan:
    """Place ``problem`` with m-ETF.

    Parameters
    ----------
    problem : Problem
    contention : bool
        Model FIFO queueing of transfers on each directed link in the estimate.

    Returns
    -------
    Plan
        Each device's order is the order m-ETF scheduled its nodes (by start time).

    Raises
    ------
    InfeasibleError
        When some node fits on no device; the message names the memory that would work.

    Examples
    --------
    >>> from tvm_pesto.solve import solve as run
    >>> from tvm_pesto.bench.random_dag import dnn_like_problem
    >>> problem = dnn_like_problem(12, cluster="2xV100-nvlink")   # 12 ops, 2 GPUs
    >>> plan = run(problem, "m-etf")
    >>> plan.solver, len(plan.assignment)
    ('m-etf', 12)
    """
    return run_solver(problem, NAME, _metf, contention=contention)
