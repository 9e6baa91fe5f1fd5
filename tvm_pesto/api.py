"""The public flow: analyze -> costs -> place -> build -> run.

Examples
--------
>>> import tvm_pesto                                   # doctest: +SKIP
>>> placed = tvm_pesto.build(mod, "cpu:2")             # doctest: +SKIP
>>> out = placed(x_numpy)                              # doctest: +SKIP
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import tvm

from .cluster import Cluster, parse_cluster
from .errors import CostError
from .graph.fusion import fusion_groups
from .graph.opgraph import OpGraph
from .graph.relax_import import RelaxGraph, from_relax
from .plan import Plan, Problem, SimResult, simulate

COST_SOURCES = ("auto", "measured", "roofline", "xgb")


@dataclass
class Analysis:
    """A module's op graph, its fusion groups and the grouped graph that gets placed."""

    rg: RelaxGraph
    groups: list[list[int]]
    graph: OpGraph  # one node per group

    @property
    def op_graph(self) -> OpGraph:
        return self.rg.graph


def analyze(mod: tvm.IRModule, func_name: str = "main") -> Analysis:
    """Extract the op graph of ``mod`` and group it into fusion groups."""
    rg = from_relax(mod, func_name)
    groups = fusion_groups(rg.graph)
    return Analysis(rg, groups, rg.graph.contract(groups, name=rg.graph.name))


def as_cluster(cluster) -> Cluster:
    return cluster if isinstance(cluster, Cluster) else parse_cluster(cluster)


def estimate_costs(analysis: Analysis, cluster: Cluster, source: str = "auto", cache=None,
                   progress=None, calibrate: bool = True) -> tuple[np.ndarray, str]:
    """[groups, devices] seconds and the source actually used.

    ``auto`` measures when every device is on this machine, and otherwise uses the
    bundled XGBoost model where it covers the device, falling back to the roofline.
    Measured costs are calibrated (``calibrate=True``): the isolated group times of a
    device are scaled to add up to the whole model's measured time on that device (see
    :func:`tvm_pesto.costs.measure.calibrate`).
    """
    if source not in COST_SOURCES:
        raise CostError(f"unknown cost source {source!r}; use one of {', '.join(COST_SOURCES)}")
    if source == "auto":
        source = "measured" if cluster.all_present else "roofline"
        if source == "roofline":
            try:
                from .costs import xgb  # noqa: F401

                source = "xgb"
            except ImportError:
                pass
    if source == "roofline":
        from .costs.roofline import roofline_costs

        return roofline_costs(analysis.graph, cluster), "roofline"
    if source == "xgb":
        try:
            from .costs.xgb import predict_costs
        except ImportError as e:
            raise CostError("the xgb cost source needs the trained cost model (tvm_pesto.costs.xgb); "
                            "use --costs measured or roofline") from e
        return predict_costs(analysis, cluster), "xgb"
    from .costs.cache import MeasureCache, target_key
    from .costs.measure import calibrate as scale_to_whole
    from .costs.measure import measure_groups, measure_whole

    cache = cache if cache is not None else MeasureCache()
    out = np.zeros((analysis.graph.num_nodes, cluster.num_devices))
    done: dict[tuple, np.ndarray] = {}
    for j, dev in enumerate(cluster.devices):
        if not dev.present:
            raise CostError(f"device {dev.name} is not on this machine, so it cannot be measured; "
                            "use --costs roofline or xgb")
        k = (target_key(dev.target), dev.cores, dev.kind)
        if k not in done:
            t = measure_groups(analysis.rg, analysis.groups, dev, cache, progress=progress)
            if calibrate:
                t, _ = scale_to_whole(t, measure_whole(analysis.rg, dev, cache))
            done[k] = t
        out[:, j] = done[k]
    return out, "measured"


@dataclass
class Placement:
    analysis: Analysis
    problem: Problem
    plan: Plan
    sim: SimResult


def place(mod_or_analysis, cluster, solver: str = "heft", costs="auto", cache=None, progress=None,
          **solver_options) -> Placement:
    """Decide device and order for every fused group of a module."""
    from .solve import solve as run_solver

    analysis = mod_or_analysis if isinstance(mod_or_analysis, Analysis) else analyze(mod_or_analysis)
    cluster = as_cluster(cluster)
    if isinstance(costs, np.ndarray):
        table, src = costs, "given"
    else:
        table, src = estimate_costs(analysis, cluster, costs, cache=cache, progress=progress)
    problem = Problem(analysis.graph, cluster, table, cost_source=src)
    problem.check_memory_feasible()
    plan = run_solver(problem, solver, **solver_options)
    return Placement(analysis, problem, plan, simulate(problem, plan))


def build(mod, cluster, solver: str = "heft", costs="auto", plan: Plan | None = None, cache=None,
          progress=None, **solver_options):
    """Place ``mod`` on ``cluster`` and build one module per device.

    Returns
    -------
    PlacedModule
    """
    from .builder.placed import PlacedModule
    from .builder.rewrite import apply_plan

    cluster = as_cluster(cluster)
    if plan is None:
        pl = place(mod, cluster, solver=solver, costs=costs, cache=cache, progress=progress, **solver_options)
        analysis, problem, plan, sim = pl.analysis, pl.problem, pl.plan, pl.sim
    else:
        analysis = analyze(mod)
        problem, sim = None, None
    placed_mod = apply_plan(analysis.rg, analysis.groups, plan, cluster)
    return PlacedModule(placed_mod, cluster, plan, problem, sim, analysis)


@tvm.ir.transform.module_pass(opt_level=0, name="tvm_pesto.Place")
class PlacementPass:
    """A module pass that places ``main`` over a cluster and outlines per-device segments.

    Use it in a ``tvm.transform.Sequential``; the result has one function per segment
    (attribute ``pesto.device``) and a ``main`` that calls them, with ``R.to_vdevice`` on
    every value that crosses devices. ``tvm_pesto.run.program.split_by_device`` gives the
    per-device modules.

    Examples
    --------
    >>> seq = tvm.transform.Sequential([PlacementPass("cpu:2", costs="roofline")])  # doctest: +SKIP
    >>> placed = seq(mod)                                                          # doctest: +SKIP
    """

    def __init__(self, cluster, solver: str = "heft", costs="auto", **solver_options):
        self.cluster = as_cluster(cluster)
        self.solver = solver
        self.costs = costs
        self.solver_options = solver_options
        self.last_placement: Placement | None = None

    def transform_module(self, mod, ctx):
        from .builder.rewrite import apply_plan

        pl = place(mod, self.cluster, solver=self.solver, costs=self.costs, **self.solver_options)
        self.last_placement = pl
        return apply_plan(pl.analysis.rg, pl.analysis.groups, pl.plan, self.cluster)
