"""A plan within a build budget: the flow's solver on costs that charge build seconds.

Each candidate has a build time (:func:`tvm_pesto.costs.measure.build_time.estimate`: seconds its
backend takes to build it on each device, 0 where the build is cached). A plan's build
time is the sum over its units. :func:`solve_within` keeps it at most ``max_build_s``:

1. a candidate that alone builds longer than the budget is left out;
2. the solver runs; a plan within the budget is the answer;
3. otherwise each candidate's cost is charged ``lam`` seconds of run time per second of
   build (``cost + lam * build_s``, a Lagrangian price), and the solver runs again, with
   ``lam`` raised fourfold until a plan fits and then bisected (geometrically) between
   the last price that did not fit and the first that did (:data:`PRICE_SOLVES` solves);
4. a price treats like units alike (two equal calls: both or neither), so from the last
   plan over the budget its slowest-building unit is left out, one at a time, and the
   solver runs again at that price, until a plan fits (:data:`MAX_SOLVES` solves in all).

The fastest plan within the budget, on the real costs, is kept.

The claim of the kept plan is against the bound of step 2's solve (no plan within the
budget beats a bound over every plan), so ``status`` and ``mip_gap`` stay honest;
``info["build_budget"]`` records the budget, the plan's estimated build seconds, the price,
the candidates left out and the solves.

Examples
--------
>>> import numpy as np
>>> from tvm_pesto.plan import JointProblem
>>> from tvm_pesto.plan.examples import chain_with_a_library_call
>>> from tvm_pesto.solve.joint.solver import solve_joint
>>> jp = chain_with_a_library_call()     # torch runs a and b as one call, or tvm runs each op
>>> def once(table):
...     p = JointProblem(jp.graph, jp.cluster, jp.candidates, table)
...     return (p, *solve_joint(p, solver="heft"))
>>> build_s = np.array([[5.0 if c.backend == "torch" else 0.0] * 2 for c in jp.candidates])
>>> _, plan, _ = solve_within(jp, build_s, 10.0, once)
>>> plan.backend_mix()                   # the torch call builds within 10 s
{'torch': 2, 'tvm': 1}
>>> _, plan, _ = solve_within(jp, build_s, 1.0, once)
>>> plan.backend_mix(), plan.info["build_budget"]["build_s"]
({'tvm': 3}, 0.0)
"""
from __future__ import annotations

import numpy as np

from ..errors import InfeasibleError, PestoError, error_line
from ..plan.simulate import simulate
from .joint.decide import restate

#: Solves of one budgeted plan at most (the unpriced one included) ...
MAX_SOLVES = 10
#: ... of which the price search makes at most this many.
PRICE_SOLVES = 6
#: The price steps up by this factor until a plan fits.
STEP = 4.0


def plan_build_s(jp, plan, build_s: np.ndarray) -> float:
    """Estimated seconds to build ``plan``'s units: the sum of ``build_s[unit, device]``."""
    return float(sum(build_s[i, int(d)] for i, d in zip(jp.cover_of(plan), plan.assignment)))


def solve_within(jp, build_s: np.ndarray, max_build_s: float, once):
    """The fastest plan found whose units build within ``max_build_s`` seconds.

    Parameters
    ----------
    jp : JointProblem
        The problem on its real costs.
    build_s : ndarray, shape (candidates, devices)
        Each candidate's estimated build seconds on each device.
    max_build_s : float
        The budget, in seconds (at least 0).
    once : callable
        ``once(table) -> (joint problem, plan, placed problem)``: the flow's solver on a cost
        table shaped like ``jp.costs``.

    Returns
    -------
    tuple
        ``(jp, plan, placed problem)`` on the real costs; ``plan.info["build_budget"]``.

    Raises
    ------
    PestoError
        When no plan found builds within the budget (the message gives the cheapest build found).
    """
    if not max_build_s >= 0:
        raise PestoError(f"max_build_s={max_build_s!r} is not a number of seconds >= 0; give the build budget in "
                         "seconds (or None for no budget)")
    table = np.array(jp.costs, dtype=np.float64)
    table[build_s > max_build_s] = np.inf  # alone over the budget
    tried: list[tuple] = []  # (price, build seconds, makespan, result, candidates banned)

    def attempt(lam: float, banned=()):
        t = table + lam * build_s  # cost + price * build seconds (inf stays inf)
        t[list(banned)] = np.inf
        res = once(t)
        plan = res[1]
        placed = jp.contract(jp.cover_of(plan))  # the real costs, not the priced ones
        tried.append((lam, plan_build_s(jp, plan, build_s), simulate(placed, plan).makespan, (jp, plan, placed),
                      tuple(banned)))
        return tried[-1]

    try:
        first = attempt(0.0)
    except InfeasibleError as e:
        raise PestoError(f"no plan builds within max_build_s={max_build_s:g} s: {error_line(e)} once the "
                         "candidates that alone build longer are left out; raise the budget") from e
    over, hi = first, None  # the last plan over the budget (at the highest price that did not fit)
    lam = first[2] / max(first[1], 1e-9)  # the whole build priced at about one makespan
    while first[1] > max_build_s and len(tried) < PRICE_SOLVES:
        t = attempt(lam)
        if t[1] <= max_build_s:
            hi = lam
        else:
            over = t
        lam = lam * STEP if hi is None else (np.sqrt(over[0] * hi) if over[0] > 0 else hi / STEP)
    # a price treats like units alike (two equal calls: both or neither); from the last plan
    # over the budget, leave out its slowest-building unit, one at a time, until one fits
    banned = []
    while over[1] > max_build_s and len(tried) < MAX_SOLVES:
        plan = over[3][1]
        units = [(build_s[i, int(d)], i) for i, d in zip(jp.cover_of(plan), plan.assignment)]
        banned.append(max(units)[1])
        try:
            over = attempt(over[0], banned)
        except InfeasibleError:
            break
    fits = [t for t in tried if t[1] <= max_build_s]
    if not fits:
        cheapest = min(t[1] for t in tried)
        raise PestoError(f"no plan found builds within max_build_s={max_build_s:g} s: the cheapest build found "
                         f"takes an estimated {cheapest:.3g} s; raise the budget, or leave out the slow-building "
                         "backends (backends=..., e.g. without inductor)")
    lam, used, span, (jp, plan, placed), left_out = min(fits, key=lambda t: t[2])
    info = plan.info
    if lam > 0 or left_out:  # the solver's claim was about another problem: restate it against the bound
        bound = first[3][1].info.get("bound_s")
        restate(info, bound, span, f"build-budget: {info.get('decided_by') or plan.solver}")
    info["build_budget"] = {"max_build_s": float(max_build_s), "build_s": used, "price": float(lam),
                            "left_out": len(left_out), "solves": len(tried), "unbudgeted_build_s": first[1]}
    return jp, plan, placed


__all__ = ["MAX_SOLVES", "PRICE_SOLVES", "plan_build_s", "solve_within"]
