"""Local search on a plan's critical path: move nodes (or runs of them) to other devices.

The ILP of :mod:`tvm_pesto.solve.placement_ilp.driver` is solved on a coarsened graph, so its expanded plan
keeps whole supernodes together; heuristics make one greedy choice per node. Both leave
easy wins on the fine graph. :func:`refine` takes such a plan and repeats, within a
budget (seconds, or in deterministic mode simulations weighted by graph size, see
:mod:`tvm_pesto.solve.budget`):

1. simulate the plan and walk its *critical chain* back from the last node to finish: at
   each step the event that decided the node's start (the previous node on its device, a
   producer on the same device, or a transfer's arrival);
2. for every node of the chain (with its co-location group), every maximal run of chain
   nodes on one device and the two halves of a long run, try each other device it may use;
   the nodes keep their place in time (each device runs its nodes in the order of their old
   start times);
3. also try reordering: a node that held its device while the chain waited for it runs
   after the chain nodes it delayed;
4. keep the change with the smallest simulated makespan if it is better, else stop: a local
   optimum;
5. then kick: move a few random nodes to random devices, descend again from there, and keep
   the result if it beats the best plan so far (an iterated local search, with a fixed
   seed), until the budget runs out or kicks stop paying.

Every candidate is checked by the simulator, memory included, so the result is always a
valid plan and never worse than the input.

:func:`tvm_pesto.solve.placement_ilp.polish.polish` runs this from several plans and keeps the best.

Examples
--------
>>> from tvm_pesto.solve import solve
>>> from tvm_pesto.solve.placement_ilp.refine import refine
>>> from tvm_pesto.bench.random_dag import dnn_like_problem
>>> problem = dnn_like_problem(12, cluster="2xV100-nvlink")   # 12 ops, 2 GPUs
>>> better = refine(problem, solve(problem, "heft"), time_budget_s=0.2, deterministic=True)
>>> better.info["refine"]["makespan_after_s"] <= better.info["refine"]["makespan_before_s"]
True
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ...errors import InfeasibleError, PlanError
from ...plan.plan import Plan
from ...plan.problem import Problem
from ...plan.reference import SimArrays
from ...plan.simulate import SimResult, simulate
from ..bounds.paths import critical_path
from ..budget import SEED, Meter, simulation_work
from ..heuristics.common import colocation_index

_REL = 1e-9  # a move must beat the incumbent by this relative margin


def _makespan(sim: SimResult) -> float:
    return float(sim.makespan)
_AT_BOUND = 1e-5  # a plan this close to a lower bound (which carries solver tolerances) is optimal


def critical_chain(problem: Problem, plan: Plan, sim: SimResult, tol: float = 1e-12) -> list[int]:
    """The nodes whose timing decided the makespan, last first.

    From the node that finishes last, step to whatever made it start when it did: the node
    before it on its device, or the producer whose output (on the same device, or through a
    transfer) arrived last. Stops at a node that started at time 0.

    Examples
    --------
    >>> from tvm_pesto.bench.random_dag import dnn_like_problem
    >>> problem = dnn_like_problem(12, cluster="2xV100-nvlink")   # 12 ops, 2 GPUs
    >>> from tvm_pesto.plan import simulate
    >>> from tvm_pesto.solve import solve
    >>> plan = solve(problem, "heft")
    >>> sim = simulate(problem, plan)
    >>> chain = critical_chain(problem, plan, sim)
    >>> bool(sim.finish[chain[0]] == sim.makespan), float(sim.start[chain[-1]])   # last first
    (True, 0.0)
    """
    n = problem.num_nodes
    if n == 0:
        return []
    prev_on_dev = np.full(n, -1, dtype=np.int64)
    for order in plan.order:
        if len(order) > 1:
            prev_on_dev[np.asarray(order[1:])] = order[:-1]
    arrive: dict[tuple[int, int], float] = {}
    for u, _sd, dd, _s, e, _b in sim.transfers.tolist():
        arrive[(int(u), int(dd))] = e
    preds: list[list[int]] = [[] for _ in range(n)]
    for u, v in zip(problem.src.tolist(), problem.dst.tolist()):
        preds[v].append(u)
    a = plan.assignment
    chain = []
    seen = set()
    v = int(np.argmax(sim.finish))
    while v >= 0 and v not in seen:
        chain.append(v)
        seen.add(v)
        s = sim.start[v]
        if s <= tol:
            break
        eps = tol + 1e-9 * abs(s)
        nxt, when = -1, -np.inf
        p = prev_on_dev[v]
        if p >= 0 and sim.finish[p] > when:
            nxt, when = int(p), sim.finish[p]
        for u in preds[v]:
            t = sim.finish[u] if a[u] == a[v] else arrive.get((u, int(a[v])), -np.inf)
            if t > when + eps:
                nxt, when = u, t
        if when < s - eps:  # nothing explains the start (cannot happen in a semi-active schedule)
            break
        v = nxt
    return chain


class _Evaluator:
    """Simulates an assignment whose devices run their nodes by ``priority``.

    Calls the C++ simulator directly on flat arrays (no :class:`Plan` until one is kept);
    returns ``(candidate, SimResult)``, or ``(candidate, None)`` when the order deadlocks or
    a device runs out of memory. ``candidate.plan()`` builds the plan. Each call is charged
    to ``meter``.
    """

    def __init__(self, problem: Problem, solver: str, meter: Meter):
        self.problem = problem
        self.solver = solver
        self.meter = meter
        self.work = simulation_work(problem.num_nodes, problem.graph.num_edges)
        self.calls = 0
        try:
            # lazy: the C++ core library (tvm-ffi) loads on first use
            from ... import _core

            self.core = _core
        except ImportError:
            self.core = None
        p = problem
        self.arrays = SimArrays(p.num_nodes, p.src.astype(np.int32), p.dst.astype(np.int32), p.ebytes, p.latency,
                                p.inv_bw, p.num_devices, p.mem, p.hosts)
        self.ids = np.arange(problem.num_nodes)

    def __call__(self, assignment: np.ndarray, priority: np.ndarray):
        self.calls += 1
        self.meter.charge(self.work)
        p = self.problem
        d = p.num_devices
        flat = np.lexsort((self.ids, priority, assignment)).astype(np.int32)
        offsets = np.zeros(d + 1, dtype=np.int32)
        np.cumsum(np.bincount(assignment, minlength=d), out=offsets[1:])
        cand = _Candidate(np.asarray(assignment, dtype=np.int32), flat, offsets, self.solver)
        if self.core is None:
            try:
                return cand, simulate(p, cand.plan())
            except (InfeasibleError, PlanError):
                return cand, None
        cost = p.costs[self.ids, assignment]
        try:
            start, finish, busy, peak, tx = self.core.simulate(self.arrays, cand.assignment, (flat, offsets), cost)
        except PlanError:
            return cand, None
        if (peak > p.capacity * (1 + 1e-9)).any():
            return cand, None
        return cand, SimResult(start, finish, float(finish.max()), busy, peak, tx)


class _Candidate:
    """An assignment and its per-device orders, flattened."""

    __slots__ = ("assignment", "flat", "offsets", "solver")

    def __init__(self, assignment, flat, offsets, solver):
        self.assignment, self.flat, self.offsets, self.solver = assignment, flat, offsets, solver

    def plan(self) -> Plan:
        o = self.offsets
        return Plan(self.assignment, [self.flat[o[k]:o[k + 1]].tolist() for k in range(len(o) - 1)],
                    solver=self.solver)


def _runs(chain: list[int], assignment: np.ndarray) -> list[list[int]]:
    """Maximal runs of consecutive chain nodes on one device (length >= 2), and the two
    halves of runs longer than 3."""
    runs, cur = [], [chain[0]] if chain else []
    for v in chain[1:]:
        if assignment[v] == assignment[cur[-1]]:
            cur.append(v)
        else:
            runs.append(cur)
            cur = [v]
    if cur:
        runs.append(cur)
    out = []
    for r in runs:
        if len(r) > 1:
            out.append(r)
        if len(r) > 3:  # halves too: a long run may be worth splitting over two devices
            out += [r[:len(r) // 2], r[len(r) // 2:]]
    return out


class _Search:
    """What one refinement shares: the problem, its co-location units, the simulator calls,
    the budget."""

    def __init__(self, problem: Problem, solver: str, meter: Meter, score=None):
        self.problem = problem
        self.meter = meter
        self.score = score or _makespan
        self.group_of, self.groups = colocation_index(problem)
        allowed = np.isfinite(problem.costs)
        for members in self.groups:
            allowed[members] = allowed[members].all(axis=0)
        self.allowed = allowed
        self.evaluate = _Evaluator(problem, solver, meter)
        self.moves = 0
        self.rounds = 0

    def out_of_time(self) -> bool:
        return self.meter.spent()

    def unit(self, nodes) -> np.ndarray:
        """``nodes`` with the rest of their co-location groups."""
        out = set()
        for v in nodes:
            g = self.group_of[v]
            out.update(self.groups[g] if g >= 0 else [v])
        return np.asarray(sorted(out), dtype=np.int64)

    def candidates(self, plan: Plan, sim: SimResult, chain: list[int]):
        """``(assignment, priority)`` pairs around ``plan``: chain moves first, then reorders."""
        a = plan.assignment
        priority = sim.start + 1e-12 * sim.finish  # zero-cost nodes keep their order
        seen: set[tuple[int, ...]] = set()
        for unit in [[v] for v in chain] + _runs(chain, a):
            nodes = self.unit(unit)
            key = tuple(nodes.tolist())
            if key in seen:
                continue
            seen.add(key)
            for k in np.flatnonzero(self.allowed[nodes].all(axis=0)):
                if not (a[nodes] == k).all():
                    cand = a.copy()
                    cand[nodes] = k
                    yield cand, priority
            yield None, None  # end of a unit
        # reorders: a node that held its device while the chain waited goes after the run of
        # chain nodes it delayed (or just after the next one); an order against the graph
        # deadlocks and is rejected by the simulator
        fwd = chain[::-1]
        for i in range(len(fwd) - 1):
            blocker, v = fwd[i], fwd[i + 1]
            if a[blocker] != a[v] or self.problem.graph.dag.has_edge(blocker, v):
                continue
            j = i + 1
            while j + 1 < len(fwd) and a[fwd[j + 1]] == a[blocker]:
                j += 1
            for last in {v, fwd[j]}:
                pr = priority.copy()
                pr[blocker] = priority[last] + 1e-12 * max(abs(priority[last]), 1e-9)
                yield a, pr
            yield None, None

    def descend(self, plan: Plan, sim: SimResult, max_rounds: int, first: bool = True) -> tuple[Plan, SimResult]:
        """Descent over :meth:`candidates` until a local optimum: take the best move of the
        first unit (a node, a run, a reorder) that has an improving one (``first``), or the
        best of the whole round."""
        for _ in range(max_rounds):
            if self.out_of_time():
                break
            self.rounds += 1
            self.meter.charge(self.evaluate.work)  # the critical chain and the round's set-up
            found = None
            for cand, priority in self.candidates(plan, sim, critical_chain(self.problem, plan, sim)):
                if cand is None:  # a unit's candidates are done
                    if (first and found is not None) or self.out_of_time():
                        break
                    continue
                cplan, csim = self.evaluate(cand, priority)
                if csim is not None and self.score(csim) < self.score(found[1] if found else sim) * (1 - _REL):
                    found = (cplan, csim)
            if found is None:
                break
            plan, sim = found[0].plan(), found[1]
            self.moves += 1
        return plan, sim

    def kick(self, plan: Plan, sim: SimResult, rng: np.random.Generator, size: int):
        """Move ``size`` random units to random devices they may use; None if that is invalid."""
        a = plan.assignment.copy()
        for v in rng.choice(self.problem.num_nodes, size=min(size, self.problem.num_nodes), replace=False):
            nodes = self.unit([int(v)])
            ok = np.flatnonzero(self.allowed[nodes].all(axis=0))
            if len(ok):  # a co-location group with no common device cannot move (nor run)
                a[nodes] = int(rng.choice(ok))
        cand, csim = self.evaluate(a, sim.start + 1e-12 * sim.finish)
        return (cand.plan(), csim) if csim is not None else None


@dataclass(frozen=True)
class RefineSettings:
    """How :func:`refine` searches.

    Attributes
    ----------
    max_rounds : int
        At most this many accepted moves per descent.
    kicks : bool
        After a descent, perturb the best plan and descend again (the iterated search).
    kick_size : int
        Nodes (with their co-location groups) a kick moves to random devices.
    patience : int
        Stop after this many kicks in a row without a gain.
    seed : int
        Seeds the kicks (default :data:`tvm_pesto.solve.budget.SEED`), so they are repeatable.
    first_improvement : bool
        Take the best move of the first unit (node, run, reorder) that has an improving one,
        instead of the best move of the whole round (default; steadier on the benchmark).
    """

    max_rounds: int = 10_000
    kicks: bool = True
    kick_size: int = 3
    patience: int = 50
    seed: int = SEED
    first_improvement: bool = False


def refine(problem: Problem, plan: Plan, time_budget_s: float = 2.0, floor_s: float = 0.0,
           deterministic: bool | None = None, meter: Meter | None = None, score=None,
           settings: RefineSettings = RefineSettings()) -> Plan:
    """Improve ``plan`` by moving critical-chain nodes between devices (module docstring).

    A descent stops at a plan no single move improves. With ``kicks`` the search then
    perturbs the best plan (``kick_size`` random nodes, with their co-location groups, to
    random devices), descends again and keeps the result when it is better: an iterated
    local search, until the time budget, ``patience`` kicks in a row without a gain, or a
    plan as short as the critical path.

    Parameters
    ----------
    problem : Problem
    plan : Plan
        A valid plan (it must simulate without error).
    time_budget_s : float
        Stop after about this many seconds (deterministic mode: nominal seconds of work).
    floor_s : float
        A lower bound on the makespan (e.g. ``lower_bound(problem)["best"]``): no kicks once
        the plan is within 1e-5 of it (default: the critical path).
    deterministic : bool, optional
        Count the budget in simulations weighted by graph size instead of seconds
        (:class:`tvm_pesto.solve.budget.Meter`), so the result is the same on any machine;
        default: the ambient mode.
    meter : Meter, optional
        The budget to draw from instead of ``time_budget_s`` and ``deterministic`` (a
        share of a caller's budget, as :func:`polish` gives).
    score : callable, optional
        ``score(sim) -> seconds`` to minimise instead of the makespan (e.g. the time per
        sample of :mod:`tvm_pesto.plan.objective`); ``makespan_before_s`` and
        ``makespan_after_s`` then hold the score (``info["refine"]["score"]`` says which).
    settings : RefineSettings
        The descents' and kicks' settings (the iterated search described above).

    Returns
    -------
    Plan
        The same ``solver`` name and ``info`` as ``plan`` plus ``refine``: rounds, moves
        accepted, kicks tried and kept, simulations run, seconds, the makespans before and
        after, and the budget's report (``budget``, ``work``, ``deterministic``: no clock
        stopped the search; else ``deterministic_reason``). The input plan itself when
        nothing better was found.

    Raises
    ------
    PlanError, InfeasibleError
        If ``plan`` itself does not simulate (deadlock, memory).

    Examples
    --------
    >>> from tvm_pesto.bench.random_dag import dnn_like_problem
    >>> problem = dnn_like_problem(12, cluster="2xV100-nvlink")   # 12 ops, 2 GPUs
    >>> from tvm_pesto.solve import solve
    >>> plan = refine(problem, solve(problem, "heft"), time_budget_s=0.2, deterministic=True)
    >>> plan.info["refine"]["makespan_after_s"] <= plan.info["refine"]["makespan_before_s"]
    True
    """
    max_rounds, first_improvement = settings.max_rounds, settings.first_improvement
    t0 = time.perf_counter()
    meter = meter if meter is not None else Meter(time_budget_s, deterministic, "refine")
    sim = simulate(problem, plan)
    value = score or _makespan
    before = value(sim)
    n, d = problem.num_nodes, problem.num_devices
    info = {"rounds": 0, "moves": 0, "kicks": 0, "kicks_kept": 0, "simulations": 1, "makespan_before_s": before,
            "makespan_after_s": before, "score": "makespan" if score is None else "objective"}
    if n == 0 or d < 2 or meter.seconds <= 0:
        info.update(meter.report(), seconds=time.perf_counter() - t0)
        return _with_info(plan, info)
    if floor_s <= 0:
        floor_s = critical_path(problem)
    floor = floor_s * (1 + _AT_BOUND)
    search = _Search(problem, plan.solver, meter, score)
    meter.charge(search.evaluate.work)  # the first simulation
    best_plan, best_sim = search.descend(plan, sim, max_rounds, first_improvement)
    rng = np.random.default_rng(settings.seed)
    misses = 0
    while settings.kicks and misses < settings.patience and value(best_sim) > floor and not search.out_of_time():
        info["kicks"] += 1
        kicked = search.kick(best_plan, best_sim, rng, settings.kick_size)
        if kicked is None:
            misses += 1
            continue
        cplan, csim = search.descend(*kicked, max_rounds, first_improvement)
        if value(csim) < value(best_sim) * (1 - _REL):
            best_plan, best_sim = cplan, csim
            info["kicks_kept"] += 1
            misses = 0
        else:
            misses += 1
    info.update(rounds=search.rounds, moves=search.moves, simulations=1 + search.evaluate.calls,
                makespan_after_s=value(best_sim), **meter.report(), seconds=time.perf_counter() - t0)
    return _with_info(best_plan, info, base=plan, sim=best_sim if best_plan is not plan else None)


def _with_info(plan: Plan, refine_info: dict, base: Plan | None = None, sim: SimResult | None = None) -> Plan:
    """``plan`` with ``base``'s solver, time and info, plus ``refine``; facts of ``base`` that
    the moves made stale are replaced by the simulated ones (``sim``) or dropped."""
    base = base or plan
    info = dict(base.info)
    if sim is not None:
        info.pop("estimated_makespan_s", None)
        if "peak_memory_bytes" in info:
            info["peak_memory_bytes"] = sim.peak_memory.tolist()
        if "makespan_s" in info:
            info["makespan_s"] = sim.makespan
    info["refine"] = refine_info
    return Plan(plan.assignment, plan.order, solver=base.solver, solve_s=base.solve_s, info=info)
