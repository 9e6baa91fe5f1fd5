"""How much a solver may do: wall-clock budgets, or work budgets in deterministic mode.

Every solver with a budget asks this module how much it may do, so a budget means the
same thing everywhere:

* **wall-clock mode** (the default): a budget of ``s`` seconds is a deadline ``s`` seconds
  from now, as before. On a busier machine a search does less, so the plan can differ.
* **deterministic mode** (``deterministic=True``, or inside :func:`deterministic_mode`):
  a budget of ``s`` seconds becomes ``s`` *nominal* seconds of work, counted in units that
  do not depend on the machine, and seeds are fixed, so the same input gives the same plan
  on any machine:

  - a local search (:class:`Meter`) counts the simulations it runs, each weighted by the
    size of the graph it simulates (:func:`simulation_work`), at
    :data:`SEARCH_WORK_PER_S` units per nominal second;
  - a MIP (:func:`mip_limits`) gets a branch-and-bound node limit of
    :data:`MIP_NODES_PER_S` nodes per nominal second of its time limit (fewer for models
    with more than :data:`MIP_REFERENCE_ROWS` constraints: a node's LP costs about its row
    count), one thread and a fixed random seed.

  The rates were set so that, on the 2-vCPU VM they were fitted on, a nominal second took
  about one second for mid-sized problems; on another machine a nominal second takes longer
  or shorter, and the plan is the same. They are rough: the root node and
  the first, strong-branching nodes of a MIP cost more than later ones, so a small MIP
  budget on a large model takes several times longer than in wall-clock mode. A wall-clock
  *cap* (:func:`cap_s`, ten times the budget plus a minute) stays as a safety net only:
  when it stops a search first, the result says so (``deterministic: False`` and the
  reason) instead of silently changing the plan.

A **wall-clock cap** over a whole call (:func:`wall_cap`) bounds every search and MIP
started inside it, in either mode: a benchmark or a caller with a deadline holds it on any
machine, and a search the cap stopped says so.

Whatever the mode, a result reports whether a clock decided it: ``deterministic`` is True
when no wall-clock limit (deadline or cap) cut the work short, so a wall-clock run whose
searches all ended on their own is reported as repeatable too. :func:`outcome` and
:func:`combine` build and merge those reports.

Examples
--------
>>> from tvm_pesto.solve.budget import Meter, deterministic_mode, is_deterministic, mip_limits
>>> is_deterministic(None), is_deterministic(True)
(False, True)
>>> with deterministic_mode():
...     is_deterministic(None)
True
>>> lim = mip_limits(2.0, "highs", deterministic=True)
>>> lim.max_nodes, lim.threads, lim.seed
(200, 1, 0)
>>> m = Meter(1.0, deterministic=True, where="refine")
>>> m.charge(SEARCH_WORK_PER_S / 2)
>>> m.left_s(), m.spent()
(0.5, False)
"""
from __future__ import annotations

import contextlib
import contextvars
import math
import time
from dataclasses import dataclass

#: Work units (simulated nodes and edges) a local search does per nominal second.
SEARCH_WORK_PER_S = 20e6
#: Fixed cost of one simulation, in the same units (array set-up around the simulator).
SIMULATION_OVERHEAD = 1500
#: Branch-and-bound nodes per nominal second of a MIP time limit, per solver, for a model
#: with at most MIP_REFERENCE_ROWS constraints.
MIP_NODES_PER_S = {"cbc": 20, "highs": 100}
MIP_REFERENCE_ROWS = 10_000
#: The wall-clock safety cap of a budget of ``s`` seconds: ``CAP_FACTOR * s + CAP_EXTRA_S``.
CAP_FACTOR = 10.0
CAP_EXTRA_S = 60.0
#: The seed of every randomised search and MIP solver in deterministic mode.
SEED = 0

_MODE: contextvars.ContextVar[bool] = contextvars.ContextVar("tvm_pesto_deterministic", default=False)
_CAP: contextvars.ContextVar[float] = contextvars.ContextVar("tvm_pesto_wall_cap", default=math.inf)
#: The shortest time limit a MIP started under a cap gets (a limit of 0 is no limit to some solvers).
MIN_MIP_S = 0.05


def is_deterministic(deterministic: bool | None = None) -> bool:
    """The mode a solver runs in: ``deterministic`` when given, else the ambient mode
    (:func:`deterministic_mode`; off by default)."""
    return _MODE.get() if deterministic is None else bool(deterministic)


@contextlib.contextmanager
def deterministic_mode(on: bool = True):
    """Run the solvers called inside the block in deterministic mode (or, ``on=False``, in
    wall-clock mode) unless a call says otherwise; for entry points, such as the
    benchmarks, that reach the solvers through code that does not pass the flag on.

    Examples
    --------
    >>> with deterministic_mode(True):
    ...     is_deterministic(), is_deterministic(False)
    (True, False)
    """
    token = _MODE.set(bool(on))
    try:
        yield
    finally:
        _MODE.reset(token)


@contextlib.contextmanager
def wall_cap(seconds: float):
    """Stop every search (:class:`Meter`) and MIP (:func:`mip_limits`) started inside the
    block ``seconds`` from now at the latest, in either mode (an outer cap still holds when
    it is earlier). A search or MIP the cap stopped reports it as a clock stop (``outcome``).

    Examples
    --------
    >>> with wall_cap(0.5):
    ...     m = Meter(30.0, deterministic=True)
    ...     round(m.deadline - m.t0, 1) <= 0.5, mip_limits(3.0, "cbc").time_limit_s <= 0.5
    (True, True)
    """
    deadline = time.perf_counter() + max(float(seconds), 0.0)
    token = _CAP.set(min(_CAP.get(), deadline))
    try:
        yield
    finally:
        _CAP.reset(token)


def cap_left_s() -> float:
    """Seconds left before the ambient :func:`wall_cap` (``inf`` outside one)."""
    return max(_CAP.get() - time.perf_counter(), 0.0)


def mode_name(deterministic: bool | None = None) -> str:
    """``"work"`` (deterministic mode) or ``"wall-clock"``: what ``info["budget"]`` says."""
    return "work" if is_deterministic(deterministic) else "wall-clock"


def cap_s(seconds: float) -> float:
    """The wall-clock safety cap of a budget of ``seconds`` in deterministic mode."""
    return CAP_FACTOR * max(float(seconds), 0.0) + CAP_EXTRA_S


def outcome(clock_stopped: bool, where: str, deterministic: bool | None = None, after_s: float | None = None) -> dict:
    """The report of one budgeted step: ``{"deterministic": bool}`` plus, when a clock
    stopped it, ``deterministic_reason``.

    Examples
    --------
    >>> outcome(False, "refine", True)
    {'deterministic': True}
    >>> outcome(True, "the MIP", True, after_s=61.0)["deterministic_reason"]
    'wall-clock cap hit in the MIP after 61 s (its work budget was not used up)'
    """
    if not clock_stopped:
        return {"deterministic": True}
    took = f" after {after_s:.3g} s" if after_s is not None else ""
    if is_deterministic(deterministic):
        why = f"wall-clock cap hit in {where}{took} (its work budget was not used up)"
    else:
        why = f"wall-clock budget ran out in {where}{took}; pass deterministic=True for work budgets"
    return {"deterministic": False, "deterministic_reason": why}


def combine(*reports: dict | None) -> dict:
    """Merge reports (dicts with ``deterministic`` and maybe ``deterministic_reason``; any
    other keys are ignored, None and dicts without ``deterministic`` are skipped): the
    result is deterministic when every part is; the reasons are joined.

    Examples
    --------
    >>> combine({"deterministic": True}, None, {"deterministic": False, "deterministic_reason": "x"})
    {'deterministic': False, 'deterministic_reason': 'x'}
    """
    parts = [r for r in reports if r and "deterministic" in r]
    reasons = []
    for r in parts:
        for why in str(r.get("deterministic_reason") or "").split("; "):
            if why and not r["deterministic"] and why not in reasons:
                reasons.append(why)
    out = {"deterministic": all(bool(r["deterministic"]) for r in parts)}
    if not out["deterministic"]:
        out["deterministic_reason"] = "; ".join(reasons) or "a wall-clock limit decided part of the result"
    return out


# -- MIPs ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class MipLimits:
    """What a MIP solver may do.

    Attributes
    ----------
    deterministic : bool
    time_limit_s : float
        The solver's time limit: the budget (wall-clock mode) or the safety cap.
    budget_s : float
        The budget asked for, in (nominal) seconds.
    max_nodes : int or None
        Branch-and-bound node limit (deterministic mode only).
    threads : int or None
        Solver threads (1 in deterministic mode; None: the solver's default).
    seed : int or None
        Random seed (:data:`SEED` in deterministic mode).
    """

    deterministic: bool
    time_limit_s: float
    budget_s: float
    max_nodes: int | None = None
    threads: int | None = None
    seed: int | None = None

    def cbc_options(self) -> list[str]:
        """Extra CBC command-line options (random seeds; the node limit and threads go
        through PuLP's own ``maxNodes`` and ``threads``)."""
        if self.seed is None:
            return []
        s = self.seed + 1  # CBC reads a seed of 0 as "from the time of day"
        return [f"randomCbcSeed {s}", f"randomSeed {s}"]

    def highs_options(self) -> dict:
        """Extra HiGHS options (``mip_max_nodes``, ``random_seed``)."""
        out = {}
        if self.max_nodes is not None:
            out["mip_max_nodes"] = int(self.max_nodes)
        if self.seed is not None:
            out["random_seed"] = int(self.seed)
        return out

    def report(self, stopped_on_time: bool, solve_s: float) -> dict:
        """:func:`outcome` of a solve that did or did not stop on its time limit, plus
        ``budget`` (the mode) and ``node_limit``."""
        out = {"budget": "work" if self.deterministic else "wall-clock", "node_limit": self.max_nodes}
        out.update(outcome(stopped_on_time, "the MIP", self.deterministic, after_s=solve_s))
        return out


def mip_limits(time_limit_s: float, solver: str, deterministic: bool | None = None, threads: int | None = None,
               rows: int = 0) -> MipLimits:
    """The limits of a MIP of ``rows`` constraints given ``time_limit_s`` seconds.

    Wall-clock mode: the time limit itself (and ``threads`` as given). Deterministic mode:
    ``ceil(time_limit_s * MIP_NODES_PER_S[solver] * min(1, MIP_REFERENCE_ROWS / rows))``
    branch-and-bound nodes, one thread, a fixed seed, and :func:`cap_s` as the time limit.
    Either way the time limit ends at an ambient :func:`wall_cap` (at least :data:`MIN_MIP_S`).

    Examples
    --------
    >>> mip_limits(3.0, "cbc").time_limit_s
    3.0
    >>> d = mip_limits(3.0, "cbc", deterministic=True)
    >>> d.max_nodes, d.time_limit_s
    (60, 90.0)
    >>> mip_limits(3.0, "cbc", deterministic=True, rows=40_000).max_nodes
    15
    """
    t = float(time_limit_s)
    left = max(cap_left_s(), MIN_MIP_S)  # an ambient wall_cap
    if not is_deterministic(deterministic):
        return MipLimits(False, min(t, left), t, threads=threads)
    rate = MIP_NODES_PER_S.get(solver, min(MIP_NODES_PER_S.values())) * min(1.0, MIP_REFERENCE_ROWS / max(rows, 1))
    return MipLimits(True, min(cap_s(t), left), t, max_nodes=max(1, math.ceil(t * rate)), threads=1, seed=SEED)


# -- local search -------------------------------------------------------------------------
def simulation_work(num_nodes: int, num_edges: int) -> float:
    """Work units of one simulation of a graph with this many nodes and edges."""
    return float(num_nodes + num_edges + SIMULATION_OVERHEAD)


class Meter:
    """A search's allowance: a deadline (wall-clock mode) or work units (deterministic mode).

    The search calls :meth:`charge` with the work it did (:func:`simulation_work` per
    simulation; ignored in wall-clock mode) and stops when :meth:`spent`. In deterministic
    mode the allowance is ``seconds * SEARCH_WORK_PER_S`` units, and the clock only matters
    at the safety cap (:func:`cap_s`); :meth:`report` says whether a clock stopped the search.

    Parameters
    ----------
    seconds : float
        The budget, in (nominal) seconds.
    deterministic : bool, optional
        The mode (default: the ambient one, see :func:`is_deterministic`).
    where : str
        What the search is, for the report.
    cap_deadline : float, optional
        A ``time.perf_counter()`` instant that ends the search whatever the budget (a
        parent's deadline or cap; an ambient :func:`wall_cap` ends it too).
    clock_only : bool
        Count no work: the meter is only the deadline (wall-clock mode) or the safety cap
        (deterministic mode), for a search that counts its own work (e.g. evaluations).

    Examples
    --------
    >>> m = Meter(2.0, deterministic=True, where="polish")
    >>> half = m.share(0.5)
    >>> half.left_s()
    1.0
    >>> half.charge(SEARCH_WORK_PER_S)
    >>> half.spent(), m.left_s()
    (True, 1.0)
    """

    def __init__(self, seconds: float, deterministic: bool | None = None, where: str = "the search",
                 cap_deadline: float | None = None, clock_only: bool = False, _parent: Meter | None = None,
                 _charge_parent: bool = True):
        self.deterministic = is_deterministic(deterministic)
        self.seconds = max(float(seconds), 0.0)
        self.where = where
        self.t0 = time.perf_counter()
        self._parent = _parent
        self._charge_parent = _charge_parent
        self.clock_only = clock_only
        if self.deterministic:
            self.work_budget = math.inf if clock_only else self.seconds * SEARCH_WORK_PER_S
            deadline = self.t0 + cap_s(self.seconds)
        else:
            self.work_budget = math.inf
            deadline = self.t0 + self.seconds
        self.deadline = min(deadline, _CAP.get(), math.inf if cap_deadline is None else cap_deadline)
        self.work = 0.0
        self.clock_stopped = False

    def charge(self, work: float) -> None:
        """Count ``work`` units done (here and in the meter this one was shared from)."""
        self.work += work
        if self._parent is not None and self._charge_parent:
            self._parent.charge(work)

    def spent(self) -> bool:
        """True once the budget is used up (work units, or the deadline in wall-clock mode)
        or the clock reached the deadline or cap; a clock stop is remembered for
        :meth:`report`, here and in the meters this one was shared from."""
        if self.work >= self.work_budget:
            return True
        if time.perf_counter() >= self.deadline:
            m = self
            while m is not None:
                m.clock_stopped = True
                m = m._parent
            return True
        return False

    def elapsed_s(self) -> float:
        """Wall-clock seconds since the meter was made."""
        return time.perf_counter() - self.t0

    def left_s(self) -> float:
        """The budget left, in (nominal) seconds."""
        if self.deterministic:
            return max(self.work_budget - self.work, 0.0) / SEARCH_WORK_PER_S
        return max(self.deadline - time.perf_counter(), 0.0)

    def share(self, fraction: float = 1.0, seconds: float | None = None, where: str | None = None,
              charge_here: bool = True) -> Meter:
        """A meter for a sub-search: ``fraction`` of what is left, or ``seconds`` (at most
        what is left when ``charge_here``), ending at this meter's deadline or cap at the
        latest. With ``charge_here`` its work counts here too; a clock stop always does."""
        left = self.left_s()
        s = left * fraction if seconds is None else (min(seconds, left) if charge_here else seconds)
        return Meter(s, self.deterministic, where or self.where, cap_deadline=self.deadline,
                     _parent=self, _charge_parent=charge_here)

    def report(self) -> dict:
        """``budget`` (the mode), ``work`` units done and ``work_budget`` (deterministic
        mode; neither for a ``clock_only`` meter) and :func:`outcome`."""
        out = {"budget": "work" if self.deterministic else "wall-clock"}
        if not self.clock_only:
            out["work"] = self.work
            if self.deterministic:
                out["work_budget"] = self.work_budget
        out.update(outcome(self.clock_stopped, self.where, self.deterministic,
                           after_s=self.elapsed_s()))
        return out


# -- the solving budget of a final choice ---------------------------------------------------
#: Seconds of solving a final choice takes in all by default: the flow's plan, the one-device
#: flow and the solves of :func:`tvm_pesto.choose.claim.certify` (``time_limit_s`` of ``tvm_pesto.build``).
SOLVE_S = 30.0
#: With wall-clock budgets, the share of the solving budget the flow's plan on the cluster
#: asked for gets when the final choice is measured; the one-device flow and the solves of
#: :func:`tvm_pesto.choose.claim.certify` share what it leaves.
FLOW_SHARE = 0.75


class Solving:
    """The solving budget of a final choice: ``time_limit_s`` seconds for all its solves.

    With wall-clock budgets the flow's plan gets :data:`FLOW_SHARE` of it when the choice is
    measured (all of it when not), and each later solve a part of what the ones before left
    (``parts``: the solves still to come, this one included; at least ``min_s``). With
    deterministic budgets every solve gets ``time_limit_s`` nominal seconds, as ``place`` does.

    Examples
    --------
    >>> b = Solving(30.0, measured=True, deterministic=False)
    >>> b.flow_s()
    22.5
    >>> b.spend(22.5); b.next_s(parts=3)
    2.5
    >>> Solving(30.0, measured=True, deterministic=True).next_s(parts=3)
    30.0
    """

    def __init__(self, time_limit_s: float, measured: bool, deterministic: bool | None = None, min_s: float = 1.0):
        self.time_limit_s, self.measured, self.min_s, self.spent_s = float(time_limit_s), measured, min_s, 0.0
        self.wall = not is_deterministic(deterministic)

    def flow_s(self) -> float:
        """The flow's time limit on the cluster asked for."""
        return self.time_limit_s * FLOW_SHARE if self.wall and self.measured else self.time_limit_s

    def next_s(self, parts: int = 1) -> float:
        """The next solve's time limit, with ``parts`` solves still to come."""
        if not self.wall:
            return self.time_limit_s
        return max(self.min_s, (self.time_limit_s - self.spent_s) / max(parts, 1))

    def left_s(self) -> float:
        """What is left of the budget (at least ``min_s``); with deterministic budgets, all of it."""
        return max(self.min_s, self.time_limit_s - self.spent_s) if self.wall else self.time_limit_s

    def spend(self, seconds: float) -> None:
        """Count a solve's seconds."""
        self.spent_s += float(seconds)


__all__ = ["CAP_EXTRA_S", "CAP_FACTOR", "FLOW_SHARE", "MIN_MIP_S", "MIP_NODES_PER_S", "MIP_REFERENCE_ROWS", "Meter",
           "MipLimits", "SEARCH_WORK_PER_S", "SEED", "SIMULATION_OVERHEAD", "SOLVE_S", "Solving", "cap_left_s", "cap_s",
           "combine", "deterministic_mode", "is_deterministic", "mip_limits", "mode_name", "outcome", "simulation_work",
           "wall_cap"]
