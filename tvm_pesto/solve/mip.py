"""What both ILPs share: model helpers, solver backends and the solver's real result.

The placement ILP (:mod:`.placement_ilp.model.build`) and the joint backend + device ILP (:mod:`.joint.ilp`)
build a :class:`pulp.LpProblem` with :func:`add_var` and :func:`lin` and solve it with
:func:`solve_mip`, which returns a :class:`MipResult`.

PuLP's own status is not enough to tell an optimum from a stop at the time limit: it maps
HiGHS's ``kTimeLimit`` to ``Optimal``, and CBC's "Stopped on time limit" with an incumbent
to ``Optimal`` as well. :func:`solve_mip` therefore reads the solver itself: highspy's model
status, MIP gap and dual bound, and the ``Result -`` block of CBC's log.

Statuses (:data:`STATUSES`):

* ``optimal``: the solver proved the solution optimal within the relative gap it was given;
* ``time_limit``: it stopped at its time limit first; ``has_solution`` tells whether it has
  an incumbent, ``gap`` how far it is from the dual bound;
* ``node_limit``: it stopped at its branch-and-bound node limit first (deterministic mode,
  see :mod:`tvm_pesto.solve.budget`), with or without an incumbent as above;
* ``infeasible``: it proved that no solution exists;
* ``no_solution``: it ended without a solution and without a proof (e.g. numerical trouble);
* ``solver_failed``: every solver tried crashed (``failures`` says how).

The limits come from :func:`tvm_pesto.solve.budget.mip_limits`: the time limit in
wall-clock mode; in deterministic mode a node limit, one thread and a fixed seed, with the
time limit raised to a safety cap whose expiry the result reports (``deterministic``).

Examples
--------
>>> import pulp
>>> prob = pulp.LpProblem("tiny", pulp.LpMinimize)
>>> x = add_var(prob, "x", 0, 4, cat=pulp.LpInteger)
>>> prob += lin([(x, 1.0)]), "obj"
>>> prob += pulp.LpConstraint(lin([(x, 2.0)]), pulp.LpConstraintGE, rhs=3.0), "two_x"
>>> res = solve_mip(prob, "highs", time_limit_s=10)
>>> res.status, res.objective, res.backend
('optimal', 2.0, 'highs')
"""
from __future__ import annotations

import math
import os
import re
import shutil
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field

import numpy as np
import pulp

from ..errors import SolverError
from .budget import MipLimits, mip_limits

STATUSES = ("optimal", "time_limit", "node_limit", "infeasible", "no_solution", "solver_failed")
SOLVERS = ("cbc", "highs")

#: The MIP builders' time unit: a model's makespan upper bound maps to this many units
#: (time scale ``MIP_TIME_SCALE / upper_bound_s``), keeping coefficients well-conditioned.
MIP_TIME_SCALE = 1000.0


# -- model helpers ------------------------------------------------------------------------
def add_var(prob: pulp.LpProblem, name: str, low=None, up=None, cat=pulp.LpContinuous) -> pulp.LpVariable:
    """A variable owned by ``prob`` (PuLP >= 3.3 API; a plain :class:`pulp.LpVariable` before).

    Examples
    --------
    >>> prob = pulp.LpProblem("p", pulp.LpMinimize)
    >>> add_var(prob, "y", 0, 1, cat=pulp.LpBinary).cat
    'Integer'
    """
    add = getattr(prob, "add_variable", None)
    if add is not None:
        return add(name, low, up, cat=cat)
    return pulp.LpVariable(name, low, up, cat)


def lin(terms, const: float = 0.0) -> pulp.LpAffineExpression:
    """The affine expression ``sum(coef * var for var, coef in terms) + const``.

    Examples
    --------
    >>> prob = pulp.LpProblem("p", pulp.LpMinimize)
    >>> a = add_var(prob, "a")
    >>> str(lin([(a, 2.0)], 1.0))
    '2.0*a + 1.0'
    """
    return pulp.LpAffineExpression(terms, constant=const)


# -- backends -----------------------------------------------------------------------------
def _system_cbc() -> str | None:
    """Path of a ``cbc`` executable on PATH (preferred over PuLP's bundled build), if any."""
    return shutil.which("cbc")


def make_backend(solver: str, time_limit_s: float, gap: float | None = None, msg: bool = False,
                 log_path: str | None = None, threads: int | None = None, limits: MipLimits | None = None):
    """A PuLP solver object for ``solver`` (``"cbc"`` or ``"highs"``).

    CBC is a system ``cbc`` when one is on PATH, else PuLP's bundled build; it starts from
    the variables' initial values (``warmStart``) and writes its log to ``log_path``. HiGHS
    runs through highspy and also starts from the initial values when every variable has one.
    ``limits`` (:func:`tvm_pesto.solve.budget.mip_limits`) replaces ``time_limit_s`` and
    ``threads`` and adds its node limit and seed.

    Raises
    ------
    SolverError
        If the solver is unknown or not installed; the message says what to install.

    Examples
    --------
    >>> type(make_backend("highs", 5.0)).__name__
    'WarmHiGHS'
    """
    if limits is not None:
        time_limit_s, threads = limits.time_limit_s, limits.threads
    if solver == "cbc":
        opts = dict(timeLimit=time_limit_s, msg=msg, warmStart=True, gapRel=gap, logPath=log_path, threads=threads)
        if limits is not None and limits.max_nodes is not None:
            opts.update(maxNodes=limits.max_nodes, options=limits.cbc_options())
        system_cbc = _system_cbc()
        if system_cbc:
            backend = pulp.COIN_CMD(path=system_cbc, **opts)
        else:
            with warnings.catch_warnings():  # PuLP 3.3 marks its bundled CBC as deprecated
                warnings.simplefilter("ignore", DeprecationWarning)
                backend = pulp.PULP_CBC_CMD(**opts)
        if not backend.available():
            raise SolverError("the CBC solver is not available; install it with `pip install pulp` "
                              "(bundles CBC) or `apt-get install coinor-cbc`, or use solver='highs'")
        return backend
    if solver == "highs":
        try:
            import highspy  # noqa: F401
        except ImportError:
            raise SolverError("the HiGHS solver needs highspy; install it with `pip install highspy`, "
                              "or use solver='cbc'") from None
        extra = limits.highs_options() if limits is not None else {}
        return _warm_highs_class()(timeLimit=time_limit_s, msg=msg, gapRel=gap, threads=threads, **extra)
    raise SolverError(f"unknown ILP solver {solver!r}; use 'cbc' or 'highs'")


def _silence_highs_banner() -> None:
    """HiGHS prints a banner on stdout (fd 1, from C++) when the process makes its first
    ``Highs`` object; make that first one here with fd 1 pointed at /dev/null."""
    global _HIGHS_QUIET
    if _HIGHS_QUIET:
        return
    _HIGHS_QUIET = True
    import highspy

    try:
        sys.stdout.flush()
        saved = os.dup(1)
    except (OSError, ValueError):  # no real stdout (e.g. captured): nothing to silence
        highspy.Highs()
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)


_HIGHS_QUIET = False


_HIGHS_THREADS: list = []  # the ``threads`` option HiGHS's process-wide scheduler was started with


def _use_highs_threads(model) -> None:
    """Run ``model`` (a ``highspy.Highs``) with the thread count its ``threads`` option asks.

    HiGHS starts one task scheduler per process, at its first solve, with that solve's
    thread count, and ignores the option of every later solve: a deterministic solve
    (``threads=1``) after a wall-clock one (all cores) then searched with all cores, and
    the LNS of a 300-op graph accepted 0 windows instead of 4 (the same call, the same
    seed: how it came out depended on what the process had solved before). So the
    scheduler is started again at this module's first solve and whenever the thread count
    changes.
    """
    import highspy

    got = model.getOptionValue("threads")  # (status, value) in highspy 1.16; a bare value in some others
    want = int(got[-1] if isinstance(got, tuple) else got)
    if _HIGHS_THREADS != [want]:  # the first solve here too: another caller may have started it
        highspy.Highs.resetGlobalScheduler(True)
    _HIGHS_THREADS[:] = [want]


def _warm_highs_class():
    import highspy

    _silence_highs_banner()

    class WarmHiGHS(pulp.HiGHS):
        """pulp.HiGHS that hands the variables' initial values to HiGHS as a start and keeps
        HiGHS's own model status and info (PuLP maps a time-limit stop to ``Optimal``)."""

        def callSolver(self, lp):
            cols = lp.variables()
            vals = [v.varValue for v in cols]
            if cols and all(val is not None for val in vals):
                idx = np.array([v.index for v in cols], dtype=np.int32)
                lp.solverModel.setSolution(len(cols), idx, np.array(vals, dtype=np.float64))
            _use_highs_threads(lp.solverModel)
            lp.solverModel.run()
            self.highs_status = lp.solverModel.getModelStatus()
            self.highs_info = lp.solverModel.getInfo()
            self.highspy = highspy

        def findSolutionValues(self, lp):
            if lp.solverModel.getModelStatus() != highspy.HighsModelStatus.kSolutionLimit:
                return super().findSolutionValues(lp)
            # a stop at mip_max_nodes, which PuLP 3.3 does not map: read the incumbent here
            if int(lp.solverModel.getInfo().primal_solution_status) != 2:
                return pulp.LpStatusNotSolved, pulp.LpSolutionNoSolutionFound
            values = list(lp.solverModel.getSolution().col_value)
            for var in lp.variables():
                var.varValue = values[var.index]
            return pulp.LpStatusOptimal, pulp.LpSolutionIntegerFeasible

    return WarmHiGHS


def lp_backend(time_limit_s: float, what: str = "the LP", fix: str = ""):
    """A PuLP solver for a plain LP: a system ``cbc`` if on PATH, else the CBC binary PuLP
    bundles (called through ``COIN_CMD``, which PuLP does not deprecate), else HiGHS.

    ``what`` and ``fix`` name the LP and the way around it in the error message.

    Raises
    ------
    SolverError
        If neither CBC nor highspy is installed.

    Examples
    --------
    >>> lp_backend(5.0).name in ("COIN_CMD", "HiGHS")
    True
    """
    path = _system_cbc() or getattr(pulp.PULP_CBC_CMD, "pulp_cbc_path", None)
    if path:
        backend = pulp.COIN_CMD(path=path, msg=False, timeLimit=time_limit_s)
        if backend.available():
            return backend
    try:
        import highspy  # noqa: F401
    except ImportError:
        raise SolverError(f"{what}: no LP solver found; install CBC (`pip install pulp` bundles it, or "
                          f"`apt-get install coinor-cbc`) or highspy{fix}") from None
    return pulp.HiGHS(msg=False, timeLimit=time_limit_s)


# -- the solver's result ------------------------------------------------------------------
@dataclass
class MipResult:
    """What a MIP solve really ended with (model units: the problem's own scaling).

    Attributes
    ----------
    status : str
        One of :data:`STATUSES` (module docstring).
    has_solution : bool
        The variables hold a feasible solution (optimal or incumbent).
    objective, bound, gap : float or None
        Objective of the solution, the solver's dual bound and the relative gap between
        them, where the solver reports them (finite values only).
    solve_s : float
        Seconds in the solver(s).
    backend : str or None
        The solver that produced the result (``"cbc"`` or ``"highs"``); None when all failed.
    solver_status : str
        The solver's own status (HiGHS model status name, CBC's ``Result -`` line).
    pulp_status : str
        PuLP's status string (``Optimal`` also after a time-limit stop).
    failures : list of str
        ``"<solver>: <error>"`` of each solver that crashed before one worked.
    determinism : dict
        :meth:`tvm_pesto.solve.budget.MipLimits.report`: ``budget`` (``"work"`` or
        ``"wall-clock"``), ``node_limit``, ``deterministic`` (no clock stopped the solver)
        and, when False, ``deterministic_reason``.
    """

    status: str
    has_solution: bool
    objective: float | None = None
    bound: float | None = None
    gap: float | None = None
    solve_s: float = 0.0
    backend: str | None = None
    solver_status: str = ""
    pulp_status: str = ""
    failures: list = field(default_factory=list)
    determinism: dict = field(default_factory=dict)

    @property
    def timed_out(self) -> bool:
        """The solver stopped at its limit before proving optimality."""
        return self.status == "time_limit"

    def info(self, time_scale: float = 1.0) -> dict:
        """The info keys both ILPs report; ``objective``/``bound`` divided by ``time_scale``
        (model time per second) and present only when known.

        Examples
        --------
        >>> MipResult("optimal", True, objective=500.0, backend="cbc").info(1000.0)["objective"]
        0.5
        """
        out = {"status": self.status, "solver_status": self.solver_status, "pulp_status": self.pulp_status,
               "timed_out": self.timed_out, "mip_gap": self.gap, "solver_backend": self.backend,
               "solver_failures": list(self.failures), "mip_solve_s": self.solve_s, **self.determinism}
        if self.objective is not None:
            out["objective"] = self.objective / time_scale
        if self.bound is not None:
            out["bound"] = self.bound / time_scale
        return out


def _finite(value) -> float | None:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _cbc_log_facts(path: str) -> dict:
    """Status line, objective, lower bound and gap from a CBC log (what it contains)."""
    facts: dict = {}
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return facts
    m = re.search(r"Result - (.*)", text)
    if m:
        facts["solver_status"] = m.group(1).strip()
    for key, pat in (("objective", r"Objective value:\s+([-\d.eE+]+)"), ("bound", r"Lower bound:\s+([-\d.eE+]+)"),
                     ("gap", r"Gap:\s+([-\d.eE+]+)")):
        m = re.search(pat, text)
        if m:
            val = _finite(m.group(1))
            if val is not None:
                facts[key] = val
    return facts


def _cbc_status(line: str) -> str | None:
    """Normalised status of CBC's ``Result -`` line, None when it says nothing we know."""
    low = line.lower()
    if "infeasible" in low:
        return "infeasible"
    if "optimal" in low:
        return "optimal"
    if re.match(r"stopped on node", low):
        return "node_limit"
    if re.match(r"stopped on (time|iteration|solution|ctrl)", low):  # a limit, in practice time
        return "time_limit"
    return None


# HiGHS model status name -> normalised status (kSolutionLimit: mip_max_nodes, the only such
# limit this package sets; the other limit stops: in practice the time limit)
_HIGHS_STATUS = {"kOptimal": "optimal", "kInfeasible": "infeasible", "kUnboundedOrInfeasible": "infeasible",
                 "kSolutionLimit": "node_limit",
                 **dict.fromkeys(("kTimeLimit", "kIterationLimit", "kInterrupt", "kObjectiveBound",
                                  "kObjectiveTarget"), "time_limit")}


def _highs_facts(backend) -> dict:
    """highspy's model status (name), objective, dual bound, gap and whether it has a solution."""
    st = getattr(backend, "highs_status", None)
    info = getattr(backend, "highs_info", None)
    if st is None or info is None:
        return {}
    name = str(st).split(".")[-1]
    return {"solver_status": name, "status": _HIGHS_STATUS.get(name),
            "objective": _finite(info.objective_function_value), "bound": _finite(info.mip_dual_bound),
            "gap": _finite(info.mip_gap), "feasible": int(info.primal_solution_status) == 2}


def _pulp_status(prob: pulp.LpProblem, has_solution: bool) -> str:
    """Normalised status from PuLP alone (when the solver said nothing readable)."""
    if prob.status == pulp.LpStatusInfeasible:
        return "infeasible"
    if prob.status == pulp.LpStatusOptimal and prob.sol_status == pulp.LpSolutionOptimal:
        return "optimal"
    return "time_limit" if has_solution else "no_solution"


def solve_mip(prob: pulp.LpProblem, solver: str = "cbc", time_limit_s: float = 30.0, gap: float | None = 1e-4,
              msg: bool = False, threads: int | None = None, fallback: bool = True,
              deterministic: bool | None = None) -> MipResult:
    """Solve a built MIP with ``solver`` and read what really happened.

    Parameters
    ----------
    prob : pulp.LpProblem
        The model; variables with initial values (``setInitialValue``) are a warm start.
    solver : {"cbc", "highs"}
    time_limit_s : float
        Limit for the solver itself; in deterministic mode a node limit instead (and a safety
        cap), see :func:`tvm_pesto.solve.budget.mip_limits`.
    gap : float, optional
        Relative MIP gap at which the solver may stop and call the solution optimal.
    fallback : bool
        When ``solver`` crashes (``PulpSolverError``, e.g. a CBC segfault), try the other one.
    deterministic : bool, optional
        Work budget (node limit, one thread, fixed seed) instead of the time limit; default:
        the ambient mode (:func:`tvm_pesto.solve.budget.is_deterministic`).

    Returns
    -------
    MipResult
        ``status="solver_failed"`` (with ``failures``) when every solver crashed;
        ``determinism`` says whether a clock decided the result.

    Raises
    ------
    SolverError
        If ``solver`` is unknown or not installed.

    Examples
    --------
    >>> from tvm_pesto.bench.random_dag import dnn_like_problem
    >>> problem = dnn_like_problem(6, cluster="2xV100-nvlink")   # 6 ops, 2 GPUs
    >>> from tvm_pesto.solve.placement_ilp.model.build import build_ilp
    >>> prob, _ = build_ilp(problem)
    >>> res = solve_mip(prob, "cbc", time_limit_s=10)
    >>> res.status
    'optimal'
    """
    log_fd, log_path = tempfile.mkstemp(prefix="pesto_cbc_", suffix=".log")
    os.close(log_fd)
    failures: list[str] = []
    used = None
    try:
        # the first solver must exist (SolverError otherwise); the fallback may be missing
        rows = prob.numConstraints()
        limits = mip_limits(time_limit_s, solver, deterministic, threads, rows)
        backend = make_backend(solver, time_limit_s, gap, msg, log_path if solver == "cbc" else None, limits=limits)
        t0 = time.perf_counter()
        for attempt in (solver, "highs" if solver == "cbc" else "cbc") if fallback else (solver,):
            try:
                if attempt != solver:
                    limits = mip_limits(time_limit_s, attempt, deterministic, threads, rows)
                    backend = make_backend(attempt, time_limit_s, gap, msg, log_path if attempt == "cbc" else None,
                                           limits=limits)
                prob.solve(backend)
                used = attempt
                break
            except (pulp.PulpSolverError, SolverError) as e:  # e.g. a CBC crash: try the other solver
                failures.append(f"{attempt}: {e}")
        solve_s = time.perf_counter() - t0
        facts = {} if used is None else _cbc_log_facts(log_path) if used == "cbc" else _highs_facts(backend)
    finally:
        try:
            os.remove(log_path)
        except OSError:
            pass
    pulp_status = pulp.LpStatus.get(prob.status, str(prob.status))
    if used is None:
        return MipResult("solver_failed", False, solve_s=solve_s, solver_status="failed", pulp_status=pulp_status,
                         failures=failures, determinism=limits.report(False, solve_s))
    has = prob.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible) and facts.get("feasible", True)
    status = facts.get("status")
    if status is None and "solver_status" in facts and used == "cbc":
        status = _cbc_status(facts["solver_status"])
    if status is None:
        status = _pulp_status(prob, has)
    if status == "optimal" and not has:  # cannot happen with a sane solver; do not claim it
        status = "no_solution"
    objective = facts.get("objective") if has else None
    if has and objective is None and prob.objective is not None:
        objective = _finite(prob.objective.value())
    return MipResult(status, bool(has), objective=objective, bound=facts.get("bound"),
                     gap=facts.get("gap") if has else None, solve_s=solve_s, backend=used,
                     solver_status=facts.get("solver_status", pulp_status), pulp_status=pulp_status,
                     failures=failures, determinism=limits.report(status == "time_limit", solve_s))


__all__ = ["MipResult", "STATUSES", "SOLVERS", "add_var", "lin", "lp_backend", "make_backend", "solve_mip"]
