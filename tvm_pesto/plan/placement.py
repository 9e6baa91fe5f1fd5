"""What the flow decided for a module, before building: :class:`Placement` (the plan, its
simulation and what they were made from), and what the solver can say of a plan
(:func:`solver_status`, :func:`solver_gap`).

:func:`tvm_pesto.api.place` makes a :class:`Placement`; :mod:`tvm_pesto.api` re-exports
these names.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..cluster.dispatch import dispatch_info
from ..graph.analysis import Analysis
from .plan import Plan
from .problem import JointProblem, Problem
from .simulate import SimResult


@dataclass
class Placement:
    """What the flow decided for a module, before building.

    Attributes
    ----------
    analysis : Analysis
    candidates : CandidateSet
    costs : CostTable
        Seconds per (candidate, device) and where they came from.
    joint : JointProblem
    problem : Problem
        The placement problem of the chosen cover (one node per unit).
    plan : Plan
        Device and order per unit; ``plan.units`` are the chosen candidates.
    sim : SimResult
        The plan simulated: ``sim.run_s`` is the predicted time of one run (the schedule's
        ``sim.makespan``, plus the home device's input and result copies, ``sim.io_s``, and
        the executor's dispatch, ``sim.dispatch_s``: :mod:`tvm_pesto.cluster.dispatch`).
    build_s : ndarray, optional
        With a build budget: each candidate's estimated build seconds on each device
        (:func:`tvm_pesto.costs.measure.build_time.estimate`); the budget and the plan's estimate are
        ``plan.info["build_budget"]``.
    """

    analysis: Analysis
    candidates: object
    costs: object
    joint: JointProblem
    problem: Problem
    plan: Plan
    sim: SimResult
    build_s: np.ndarray | None = None

    @property
    def backend_mix(self) -> dict[str, int]:
        return self.plan.backend_mix()

    @property
    def solver_status(self) -> str:
        return solver_status(self.plan)

    def claim(self) -> dict:
        """What the solver says of the plan: which step decided it, its status, the proven
        bound and the gap to it (under the split margin, when one decided; ``solver_bound_all_s``
        bounds every plan without it), each heuristic's makespan; with the cluster, the
        predicted run and the solve time."""
        info = self.plan.info
        return {"cluster": self.problem.cluster.name, "decided_by": info.get("decided_by"),
                "solver_status": self.solver_status, "solver_gap": solver_gap(self.plan),
                "solver_bound_s": info.get("bound_s"), "solver_bound_all_s": info.get("bound_all_s"),
                "split_margin": info.get("split_margin"), "heuristics_s": info.get("heuristics"),
                "build_budget": info.get("build_budget"),
                "simulated_s": float(self.sim.run_s), "solve_s": float(self.plan.solve_s)}

    def summary(self) -> dict:
        return {"backend_mix": self.backend_mix, "solver": self.plan.solver, **self.claim(),
                "simulated_makespan_s": float(self.sim.makespan),
                "dispatch_s": float(self.sim.dispatch_s), "dispatch": dispatch_info(self.problem.cluster),
                "devices_used": self.plan.devices_used(),
                "num_ops": self.analysis.op_graph.num_nodes, "num_units": self.problem.num_nodes,
                "num_candidates": len(self.candidates), "candidates_by_backend": self.candidates.by_backend(),
                "backends_unavailable": dict(self.candidates.unavailable), "costs": self.costs.summary()}


def solver_status(plan: Plan) -> str:
    """What the solver can say of the plan: ``optimal`` (proved, within the MIP gap; for
    ``auto``: the plan meets the proven bound), ``feasible`` (``auto``: a bound was proved,
    see ``solver_gap``),
    ``time_limit`` (the ILP stopped at its limit with an incumbent; see ``solver_gap``),
    ``node_limit`` (the same at its node limit, in deterministic mode),
    ``infeasible`` / ``no_solution`` / ``solver_failed`` (an ILP with a fallback plan),
    ``feasible`` (a coarsened ILP: optimal for the supernodes at best, not for the graph),
    ``heuristic`` (a heuristic's plan: no claim)."""
    info = plan.info
    if info.get("joint_ilp", {}).get("used"):
        return str(info["joint_ilp"].get("status") or "feasible")
    if info.get("status"):
        return str(info["status"])
    if info.get("coarse_status"):
        return "feasible"
    return "heuristic"


def solver_gap(plan: Plan) -> float | None:
    """The relative MIP gap the ILP reported for the plan (``auto``: the plan's relative gap
    to the proven bound; ``None`` for heuristics)."""
    info = plan.info
    if info.get("joint_ilp", {}).get("used"):
        return info["joint_ilp"].get("mip_gap")
    return info.get("mip_gap", info.get("coarse_mip_gap"))


__all__ = ["Placement", "solver_gap", "solver_status"]
