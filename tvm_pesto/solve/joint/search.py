"""Local search over backend and device together, from a placed cover.

The cover that Collage's search picks is the cheapest one when everything runs on one
device; with several devices a different cover can be faster (a large library call can
block the parallelism that smaller calls on two devices would have). :func:`improve`
starts from a placed cover and tries, for the units on the plan's critical chain:

* **swap**: the same ops on another backend (another candidate with the same node set),
  on each device;
* **split**: the cheapest cover of the unit's ops by smaller candidates, all on the
  unit's device, alternating between its device and each other device, or with every
  unit placed again by HEFT (a large call that blocked parallelism, split and spread);
* **merge**: one candidate that covers exactly this unit and its neighbours, on each of
  their devices;

then, between rounds, the placement local search of :func:`tvm_pesto.solve.placement_ilp.refine.refine`
(move units between devices, reorder). New units take their place in each device's order
from the current schedule (after their inputs' finish times), so no order contradicts the
data. Every candidate plan is simulated; a move is kept when the makespan drops.

The budget is counted in evaluated plans (``max_evals``) and capped by ``budget_s``
seconds. In deterministic mode (:mod:`tvm_pesto.solve.budget`) only ``max_evals`` counts,
the inner local searches get work budgets, and ``budget_s`` is just the basis of a
wall-clock safety cap whose expiry ``info["deterministic"]`` reports, so a run is the same
on any machine.

Examples
--------
>>> from tvm_pesto.plan.examples import chain_with_a_library_call
>>> problem = chain_with_a_library_call()   # a -> b -> c; tvm per op, or torch for a and b
>>> from tvm_pesto.solve import solve
>>> cover = [0, 1, 2]                      # every op a tvm call of its own: 5.0 s in a row
>>> placed = problem.contract(cover)
>>> plan = solve(placed, "heft")
>>> plan, placed, cover, span, info = improve(problem, plan, placed, cover, budget_s=2.0, deterministic=True)
>>> sorted(cover), span, info["accepted"]["merge"]   # a and b merged into the torch call
([2, 3], 4.0, 1)
"""
from __future__ import annotations

import numpy as np

from ...errors import PestoError
from ...plan.plan import Plan
from ...plan.problem import JointProblem, Problem
from ...plan.simulate import simulate
from ..budget import Meter
from ..heuristics.heft import solve as heft
from ..placement_ilp.refine import critical_chain, refine
from .cover import best_cover

_REL = 1e-9


class _Moves:
    """Candidate index lookups for one joint problem."""

    def __init__(self, problem: JointProblem):
        self.problem = problem
        self.sets = [tuple(sorted(c.nodes)) for c in problem.candidates]
        self.usable = np.isfinite(problem.costs).any(axis=1)
        self.by_set: dict[tuple, list[int]] = {}
        self.containing: dict[int, list[int]] = {}
        for c, s in enumerate(self.sets):
            if not self.usable[c]:
                continue
            self.by_set.setdefault(s, []).append(c)
            for v in s:
                self.containing.setdefault(v, []).append(c)

    def swaps(self, c: int) -> list[int]:
        return [o for o in self.by_set.get(self.sets[c], []) if o != c]

    def split(self, c: int, device: int) -> list[int] | None:
        """The cheapest cover of ``c``'s ops by strictly smaller candidates on ``device``."""
        inside = set(self.sets[c])
        subs = [o for v in inside for o in self.containing.get(v, [])
                if len(self.sets[o]) < len(inside) and inside.issuperset(self.sets[o])]
        subs = sorted(set(subs))
        if not subs:
            return None
        costs = self.problem.costs[subs, device]
        if not np.isfinite(costs).any():
            return None
        try:
            res = best_cover(self.problem.graph, [self.sets[o] for o in subs], costs, nodes=inside, exact_work=0)
        except PestoError:
            return None
        return [subs[i] for i in res.chosen]

    def merges(self, c: int, unit_of: dict[int, int], cover: list[int]) -> list[tuple[int, list[int]]]:
        """Candidates that cover exactly unit ``c`` plus whole neighbouring units:
        ``(candidate, [unit positions it replaces])``."""
        out = []
        seen = set()
        for v in self.sets[c]:
            for o in self.containing.get(v, []):
                if o in seen or len(self.sets[o]) <= len(self.sets[c]):
                    continue
                seen.add(o)
                units = {unit_of[w] for w in self.sets[o]}
                if sum(len(self.sets[cover[u]]) for u in units) == len(self.sets[o]):
                    out.append((o, sorted(units)))
        return out


def _replan(problem: JointProblem, cover: list[int], placed: Problem, plan: Plan, sim, removed: list[int],
            added: list[int], devices: list[int]) -> tuple[list[int], Plan, Problem] | None:
    """The cover with units ``removed`` (positions) replaced by candidates ``added`` on
    ``devices``; each device's order follows the current start times, new units right
    after their inputs finish."""
    keep = [k for k in range(len(cover)) if k not in set(removed)]
    new_cover = [cover[k] for k in keep] + list(added)
    try:
        new_placed = problem.contract(new_cover)
    except PestoError:
        return None
    assign = np.concatenate([plan.assignment[keep], np.asarray(devices, dtype=np.int64)]).astype(np.int64)
    prio = np.empty(len(new_cover))
    prio[:len(keep)] = sim.start[keep]
    g = new_placed.graph
    old_finish = np.concatenate([sim.finish[keep], np.zeros(len(added))])
    for q in g.topo_order():
        if q < len(keep):
            continue
        t = 0.0
        for p in g.dag.predecessors(q):
            t = max(t, old_finish[p] if p < len(keep) else prio[p] + 1e-12)
        prio[q] = t
        old_finish[q] = t
    topo = np.empty(len(new_cover), dtype=np.int64)
    topo[g.topo_order()] = np.arange(len(new_cover))
    key = np.lexsort((topo, prio))
    rank = np.empty(len(new_cover), dtype=np.int64)
    rank[key] = np.arange(len(new_cover))
    return new_cover, Plan.from_assignment(assign, rank, problem.num_devices, solver=plan.solver), new_placed


def improve(problem: JointProblem, plan: Plan, placed: Problem, cover: list[int], budget_s: float = 5.0,
            max_evals: int = 4000, refine_s: float | None = None, deterministic: bool | None = None):
    """Improve a placed cover by backend and device moves together (see the module doc).

    Parameters
    ----------
    budget_s : float
        Wall-clock budget (deterministic mode: the basis of the safety cap only).
    max_evals : int
        At most this many evaluated plans.
    refine_s : float, optional
        Budget of each placement local search between rounds (default: a tenth of
        ``budget_s``, at least 0.2 s); nominal seconds of work in deterministic mode.
    deterministic : bool, optional
        Work budgets only (see the module doc); default: the ambient mode.

    Returns
    -------
    (plan, placed, cover, makespan, info)
        Never worse than the input; ``info`` counts evaluations and accepted moves by kind
        and has the budget's report (``budget``, ``deterministic``: no clock stopped the
        search; else ``deterministic_reason``).
    """
    meter = Meter(budget_s, deterministic, "the joint search", clock_only=True)
    mv = _Moves(problem)
    D = problem.num_devices
    s = _Incumbent(problem, plan, placed, cover, meter, max_evals)
    start_span = s.best
    info = s.info
    refine_s = max(0.2, budget_s / 10) if refine_s is None else refine_s
    improved = True
    while improved and not s.out_of_budget():
        improved = False
        info["rounds"] += 1
        chain = critical_chain(s.placed, s.plan, s.sim)
        unit_of = {v: k for k, c in enumerate(s.cover) for v in mv.sets[c]}
        for k in list(dict.fromkeys(chain)):
            if s.out_of_budget() or improved:
                break
            improved = s.move_unit(k, mv, unit_of)
        if not improved and D > 1 and not s.out_of_budget():
            # its own work budget; a clock stop (deadline or cap) counts here too
            r = refine(s.placed, s.plan, meter=meter.share(seconds=refine_s, where="the joint search's refine",
                                                           charge_here=False))
            rs = simulate(s.placed, r)
            if rs.makespan < s.best * (1 - _REL):
                s.plan = Plan(r.assignment, r.order, solver=s.plan.solver, info=s.plan.info)
                s.sim, s.best = rs, rs.makespan
                info["accepted"]["refine"] += 1
                improved = True
    info.update(meter.report(), seconds=meter.elapsed_s(), makespan_before_s=float(start_span),
                makespan_after_s=float(s.best))
    plan = Plan(s.plan.assignment, s.plan.order, solver=s.plan.solver, solve_s=s.plan.solve_s, info=dict(s.plan.info))
    return plan, s.placed, s.cover, s.best, info


class _Incumbent:
    """The best cover of :func:`improve` so far (its plan, placement problem, schedule and
    makespan) and the search's counters."""

    def __init__(self, problem: JointProblem, plan: Plan, placed: Problem, cover: list[int], meter: Meter,
                 max_evals: int):
        self.problem, self.meter, self.max_evals = problem, meter, max_evals
        self.plan, self.placed, self.cover = plan, placed, cover
        self.sim = simulate(placed, plan)
        self.best = self.sim.makespan
        self.info = {"evaluations": 0, "accepted": {"swap": 0, "split": 0, "merge": 0, "refine": 0}, "rounds": 0}

    def out_of_budget(self) -> bool:
        return self.info["evaluations"] >= self.max_evals or self.meter.spent()

    def evaluate(self, removed, added, devices) -> bool:
        """Replace units ``removed`` by candidates ``added`` on ``devices`` (None: place
        every unit again with HEFT); keep it when the makespan drops."""
        problem, cover = self.problem, self.cover
        self.info["evaluations"] += 1
        if devices is None:
            keep = [k for k in range(len(cover)) if k not in set(removed)]
            new_cover = [cover[k] for k in keep] + list(added)
            try:
                new_placed = problem.contract(new_cover)
                new_plan = heft(new_placed)
            except PestoError:
                return False
        else:
            res = _replan(problem, cover, self.placed, self.plan, self.sim, removed, added, devices)
            if res is None:
                return False
            new_cover, new_plan, new_placed = res
        if any(len(set(new_plan.assignment[grp].tolist())) > 1 for grp in new_placed.colocate):
            return False  # a co-location group split across devices
        try:
            new_sim = simulate(new_placed, new_plan)
        except PestoError:
            return False
        if new_sim.makespan < self.best * (1 - _REL):
            self.cover, self.plan, self.placed, self.sim, self.best = (new_cover, new_plan, new_placed, new_sim,
                                                                       new_sim.makespan)
            return True
        return False

    def move_unit(self, k: int, mv: _Moves, unit_of: dict) -> bool:
        """Try the moves of unit ``k`` (swaps, then splits, then merges) until one is kept;
        whether one was."""
        problem, D, accepted = self.problem, self.problem.num_devices, self.info["accepted"]
        c, d = self.cover[k], int(self.plan.assignment[k])
        for o in mv.swaps(c):
            for e in range(D):
                if np.isfinite(problem.costs[o, e]) and self.evaluate([k], [o], [e]):
                    accepted["swap"] += 1
                    return True
            if self.out_of_budget():
                return False
        if self.out_of_budget():
            return False
        if len(mv.sets[c]) > 1:
            pieces = mv.split(c, d)
            if pieces:
                options = [[d] * len(pieces)] + [[d if i % 2 == 0 else e for i in range(len(pieces))]
                                                 for e in range(D) if e != d] + ([None] if D > 1 else [])
                for devs in options:
                    if self.evaluate([k], pieces, devs):
                        accepted["split"] += 1
                        return True
        if self.out_of_budget():
            return False
        for o, units in mv.merges(c, unit_of, self.cover):
            for e in sorted({int(self.plan.assignment[u]) for u in units}):
                if np.isfinite(problem.costs[o, e]) and self.evaluate(units, [o], [e]):
                    accepted["merge"] += 1
                    return True
            if self.out_of_budget():
                return False
        return False


__all__ = ["improve"]
