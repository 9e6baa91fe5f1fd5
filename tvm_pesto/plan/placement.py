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


@dataclass(frozen=True)
class NodeRow:
    """Where one op-graph node runs (:meth:`Placement.node_table`): its id, name, Relax op and
    binding, the backend and device of its unit, the unit's index in the plan, and the pin that
    holds it (its op and the pin as spelled; None when no pin does)."""

    node: int
    name: str
    op: str
    binding: str
    backend: str
    device: str
    unit: int
    pinned: str | None = None


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
    constraints : NodeConstraints, optional
        The user's constraints the plan was made under (:mod:`tvm_pesto.constraints`): the
        claim holds under them (``claim()["holds_under"]``), not for the unconstrained problem.
    """

    analysis: Analysis
    candidates: object
    costs: object
    joint: JointProblem
    problem: Problem
    plan: Plan
    sim: SimResult
    build_s: np.ndarray | None = None
    constraints: object = None

    @property
    def holds_under(self) -> list[str]:
        """The constraints the plan and its claim hold under, as spelled (empty: none)."""
        return [] if self.constraints is None else self.constraints.constraints.spellings()

    def node_table(self) -> list["NodeRow"]:
        """Where every op-graph node runs: one :class:`NodeRow` per node, in node order."""
        g, devices = self.analysis.op_graph, self.problem.cluster.devices
        rows: list[NodeRow | None] = [None] * g.num_nodes
        pinned = (lambda v: None) if self.constraints is None else self.constraints.pinned
        for k, (u, d) in enumerate(zip(self.plan.units, self.plan.assignment)):
            for v in u.nodes:
                nd = g.nodes[v]
                rows[v] = NodeRow(int(v), nd.name, nd.op, str(nd.extra.get("var", "")), u.backend,
                                  devices[int(d)].name, k, pinned(v))
        return [r for r in rows if r is not None]

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
        predicted run and the solve time. ``holds_under`` names the user's constraints the
        status and bound hold under (an ``optimal`` plan under a pin is optimal among the
        plans that honour it, not for the unconstrained problem)."""
        info = self.plan.info
        return {"cluster": self.problem.cluster.name, "decided_by": info.get("decided_by"),
                "solver_status": self.solver_status, "solver_gap": solver_gap(self.plan),
                "solver_bound_s": info.get("bound_s"), "solver_bound_all_s": info.get("bound_all_s"),
                "split_margin": info.get("split_margin"), "heuristics_s": info.get("heuristics"),
                "build_budget": info.get("build_budget"), "holds_under": self.holds_under,
                "simulated_s": float(self.sim.run_s), "solve_s": float(self.plan.solve_s)}

    def summary(self) -> dict:
        return {"backend_mix": self.backend_mix, "solver": self.plan.solver, **self.claim(),
                "simulated_makespan_s": float(self.sim.makespan),
                "dispatch_s": float(self.sim.dispatch_s), "dispatch": dispatch_info(self.problem.cluster),
                "switches": int(self.sim.switches), "switch_s": float(self.sim.switch_s),
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


__all__ = ["NodeRow", "Placement", "solver_gap", "solver_status"]
