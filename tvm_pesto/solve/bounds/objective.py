"""Lower bounds for every objective and execution model (:mod:`tvm_pesto.plan.objective`).

The objective is ``latency`` or ``time_per_sample = (latency + (K - 1) * bottleneck) / K``,
a fixed positive combination of a plan's latency and its bottleneck (largest device or link
load per sample). So a lower bound on each, valid for every plan of the model, gives one on
the objective (:func:`objective_lower_bound`):

**Bottleneck** (both models): the largest device load is at least

* ``max_node_s``: the costliest node at its cheapest device;
* ``work_s``: all the cheapest work spread over the devices;
* ``load_lp_s``: the LP of :func:`tvm_pesto.solve.bounds.makespan.lp_bound` without start times
  (fractional load balancing with memory and co-location), up to ``lp_max_nodes`` nodes;
* ``stage_dp_s`` (stage model, where the graph allows): the exact contiguous-split DP of
  :mod:`tvm_pesto.solve.stage.ideal_dp`, communication included: the best max-load of any valid
  stage plan (with zero-cost inputs and outputs left out, which only lowers it).

Transfers, received tensors and (op model) links only add load, so each holds.

**Latency**: a device is busy for its whole load within one sample's time, so latency >=
bottleneck in both models. Op model: also :func:`tvm_pesto.solve.bounds.makespan.lower_bound`
(critical path, work, LP, segment and path-memory bounds). Stage model: the critical path
with free transfers, the LP with start times (a block runs its ops one after another, so
their starts satisfy it) and the path-memory bound in the stage model's terms
(:func:`tvm_pesto.solve.bounds.comm.path_memory_bound` with ``stage=True``: runs hold only
their nodes' memory, a change of device costs an out and an in phase) and the chain bound of
:mod:`tvm_pesto.solve.stage.bounds` (at most one stage per device and pass limits how much
runs side by side); the op model's segment bound assumes its transfer rules and is not used.

**The host pool** (:class:`tvm_pesto.plan.problem.HostPool`: the benchmark's latency rule,
where CPU nodes run side by side on cores of their own): the bottleneck, the LP (device loads
serialise a device's nodes) and the chain bound (at most one stage per CPU) no longer hold
for the latency; the critical path and the path-memory bound do (the nodes of one path still
run one after another, CPU to CPU moves are free, and an accelerator's memory and in and out
phases are as before), and so does the hull bound of :mod:`tvm_pesto.solve.stage.hull_bound`
(a run of a path on an accelerator holds every node between its ends).

Examples
--------
>>> from tvm_pesto.bench.random_dag import dnn_like_problem
>>> problem = dnn_like_problem(12, cluster="2xV100-nvlink")   # 12 ops, 2 GPUs
>>> from tvm_pesto.plan.objective import evaluate
>>> from tvm_pesto.solve import solve
>>> plan = solve(problem, "stage-dp", model="stage", objective="throughput")
>>> lb = objective_lower_bound(problem, "stage", "throughput")
>>> lb["best"] <= evaluate(problem, plan, "stage", "throughput").objective_value
True
"""
from __future__ import annotations

import numpy as np

from ...plan.objective import check_choice, time_per_sample
from ...plan.problem import Problem
from ..budget import mode_name
from ..stage.bounds import stage_latency_bound
from ..stage.hull_bound import hull_path_bound
from ..stage.ideal_dp import dp_bound
from .comm import path_memory_bound
from .makespan import lower_bound, lp_bound
from .paths import critical_path, min_costs

_SAFETY = 1e-6  # relative margin against LP solver tolerances


def bottleneck_lower_bound(problem: Problem, model: str = "op", lp: bool | None = None, lp_max_nodes: int = 1000,
                           dp: bool = True) -> dict:
    """The bottleneck bounds of the module docstring; ``best`` is the largest.

    Examples
    --------
    >>> from tvm_pesto.bench.random_dag import dnn_like_problem
    >>> problem = dnn_like_problem(12, cluster="2xV100-nvlink")   # 12 ops, 2 GPUs
    >>> b = bottleneck_lower_bound(problem, "stage")
    >>> b["best"] >= b["work_s"]
    True
    """
    n, d = problem.num_nodes, problem.num_devices
    mc = min_costs(problem) if n else np.zeros(0)
    out = {"max_node_s": float(mc.max()) if n else 0.0, "work_s": float(mc.sum() / d) if n else 0.0,
           "load_lp_s": None, "stage_dp_s": None}
    if lp is None:
        lp = n <= lp_max_nodes
    if lp and n:
        val, status = lp_bound(problem, precedence=False)
        out["load_lp_status"] = status
        if val is not None:
            out["load_lp_s"] = val if not np.isfinite(val) else max(0.0, val * (1 - _SAFETY) - 1e-12)
    if model == "stage" and dp and n:
        res = dp_bound(problem)
        out["stage_dp_s"] = res["bound_s"]
        out["stage_dp"] = {k: v for k, v in res.items() if k != "bound_s"}
    out["best"] = float(max(v for k, v in out.items() if k.endswith("_s") and v is not None))
    return out


def objective_lower_bound(problem: Problem, model: str = "op", objective: str = "latency", microbatches=None,
                          lp: bool | None = None, lp_max_nodes: int = 1000, comm: bool | None = None,
                          deterministic: bool | None = None, latency_bound: dict | None = None) -> dict:
    """A lower bound on ``objective`` in ``model`` for every plan (module docstring).

    Parameters
    ----------
    problem : Problem
    model, objective, microbatches
        As in :func:`tvm_pesto.plan.objective.evaluate`.
    lp, lp_max_nodes, comm, deterministic
        As in :func:`tvm_pesto.solve.bounds.makespan.lower_bound` (``lp`` also for the load LP).
    latency_bound : dict, optional
        An op-model :func:`~tvm_pesto.solve.bounds.makespan.lower_bound` already computed (reused).

    Returns
    -------
    dict
        ``best`` (the bound on the objective), ``latency_s`` and ``bottleneck_s`` (the two
        bounds it combines), ``latency`` and ``bottleneck`` (their parts), ``model``,
        ``objective``, ``microbatches``, ``budget`` and ``deterministic``.

    Examples
    --------
    >>> from tvm_pesto.bench.random_dag import dnn_like_problem
    >>> problem = dnn_like_problem(12, cluster="2xV100-nvlink")   # 12 ops, 2 GPUs
    >>> lb = objective_lower_bound(problem, "op", "throughput", microbatches=8)
    >>> lb["bottleneck_s"] <= lb["best"] <= lb["latency_s"]   # (latency + 7 bottleneck) / 8
    True
    """
    model, objective, microbatches = check_choice(model, objective, microbatches)
    bott = bottleneck_lower_bound(problem, model, lp=lp, lp_max_nodes=lp_max_nodes)
    det = {"deterministic": True}
    if model == "op":
        lat = latency_bound if latency_bound is not None else lower_bound(
            problem, lp=lp, lp_max_nodes=lp_max_nodes, comm=comm, deterministic=deterministic)
        det = {k: lat[k] for k in ("deterministic", "deterministic_reason") if k in lat}
        lat_parts = {k: lat.get(k) for k in ("critical_path_s", "work_s", "lp_s", "segment_s", "path_memory_s")}
    else:
        pooled = problem.pooled(model, objective, microbatches)
        lat_parts = {"critical_path_s": critical_path(problem) if problem.num_nodes else 0.0, "lp_s": None,
                     "path_memory_s": path_memory_bound(problem, stage=True)["bound_s"] if problem.num_nodes else 0.0,
                     "stage_chain_s": None if pooled else stage_latency_bound(problem)["bound_s"]}
        if pooled:
            lat_parts["hull_path_s"] = hull_path_bound(problem)["bound_s"] if problem.num_nodes else 0.0
        if (problem.num_nodes <= lp_max_nodes if lp is None else lp) and problem.num_nodes and not pooled:
            val, _ = lp_bound(problem)
            if val is not None:
                lat_parts["lp_s"] = val if not np.isfinite(val) else max(0.0, val * (1 - _SAFETY) - 1e-12)
    if not problem.pooled(model, objective, microbatches):
        lat_parts["bottleneck_s"] = bott["best"]
    lat_best = float(max(v for v in lat_parts.values() if v is not None))
    best = lat_best if objective == "latency" else time_per_sample(lat_best, bott["best"], microbatches)
    return {"best": float(best), "latency_s": lat_best, "bottleneck_s": bott["best"], "latency": lat_parts,
            "bottleneck": bott, "model": model, "objective": objective, "microbatches": microbatches,
            "budget": mode_name(deterministic), **det}


__all__ = ["bottleneck_lower_bound", "objective_lower_bound"]
