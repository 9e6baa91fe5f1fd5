"""What a plan costs: one objective (``latency`` or ``throughput``) in one execution model
(``op`` or ``stage``).

* ``latency``: one sample's time from the first op to the last. In the ``op`` model the
  simulator's makespan (:func:`tvm_pesto.plan.simulate`); in the ``stage`` model the last
  block's finish (:mod:`tvm_pesto.plan.stage`).
* ``throughput``: the time per sample when ``K`` microbatches stream through the devices,
  PipeDream/GPipe style. Every device (and, in the op model, every directed link) handles
  each sample once, so in steady state a new sample can start only every
  ``bottleneck = max(largest device load, largest link load)`` seconds; the first sample
  also has to fill the pipeline, so ``K`` samples take ``latency + (K - 1) * bottleneck``
  and the time per sample is that divided by ``K`` (:func:`time_per_sample`).
  ``microbatches=None`` means steady state (``K`` -> infinity: the bottleneck alone, the
  dnn-partitioning paper's max-load). A device's load is its busy time per sample: the sum
  of its ops (op model) or of its blocks, communication included (stage model); a link's
  load is the time its transfers take per sample (op model; in the stage model transfers
  are inside the blocks). Forward+backward graphs are one sample each way: both passes
  count in every load.

Where a problem's host pool holds (:class:`tvm_pesto.plan.problem.HostPool`: one sample's
stage latency on a dnn-partitioning file), the stage model judges by its rules.

Memory is checked the model's way (the op model counts received tensors, the stage model
the graph's own sizes); :func:`evaluate` reports violations instead of raising, so imported
plans can be judged.

Examples
--------
>>> time_per_sample(10.0, 2.0, 1), time_per_sample(10.0, 2.0, 5), time_per_sample(10.0, 2.0, None)
(10.0, 3.6, 2.0)
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..errors import PestoError
from .plan import Plan
from .problem import Problem
from .simulate import SimResult, simulate
from .stage import StageResult, evaluate_stages

MODELS = ("op", "stage")
OBJECTIVES = ("latency", "throughput")
_TOL = 1e-9


def check_choice(model: str, objective: str, microbatches=None) -> tuple[str, str, int | None]:
    """``(model, objective, microbatches)`` checked and normalised (``microbatches`` of 0 or
    None means steady state).

    Raises
    ------
    PestoError
        For an unknown model or objective, or a negative number of microbatches.

    Examples
    --------
    >>> check_choice("stage", "throughput", 0)
    ('stage', 'throughput', None)
    """
    if model not in MODELS:
        raise PestoError(f"unknown execution model {model!r}; use {' or '.join(MODELS)}")
    if objective not in OBJECTIVES:
        raise PestoError(f"unknown objective {objective!r}; use {' or '.join(OBJECTIVES)}")
    if microbatches is not None:
        if isinstance(microbatches, float) and math.isinf(microbatches):
            microbatches = None
        elif int(microbatches) != microbatches or int(microbatches) < 0:
            raise PestoError(f"--microbatches must be a whole number >= 1 (0: steady state), not {microbatches}")
        else:
            microbatches = int(microbatches) or None
    return model, objective, microbatches


def time_per_sample(latency_s: float, bottleneck_s: float, microbatches: int | None) -> float:
    """``(latency + (K - 1) * bottleneck) / K`` for ``K = microbatches``; the bottleneck for
    ``None`` (steady state). The one place that formula lives (objectives and bounds)."""
    if microbatches is None:
        return float(bottleneck_s)
    k = int(microbatches)
    return float((latency_s + (k - 1) * bottleneck_s) / k)


def op_loads(problem: Problem, sim: SimResult) -> tuple[np.ndarray, np.ndarray]:
    """``(device busy seconds, link seconds [src, dst])`` per sample in the op model.

    Examples
    --------
    >>> from tvm_pesto.bench.random_dag import dnn_like_problem
    >>> problem = dnn_like_problem(12, cluster="2xV100-nvlink")   # 12 ops, 2 GPUs
    >>> from tvm_pesto.plan import simulate
    >>> from tvm_pesto.solve import solve
    >>> busy, links = op_loads(problem, simulate(problem, solve(problem, "heft")))
    >>> busy.shape, links.shape
    ((2,), (2, 2))
    """
    d = problem.num_devices
    links = np.zeros((d, d))
    if len(sim.transfers):
        t = sim.transfers
        np.add.at(links, (t[:, 1].astype(np.int64), t[:, 2].astype(np.int64)), t[:, 4] - t[:, 3])
    return np.asarray(sim.busy, dtype=np.float64), links


@dataclass
class Evaluation:
    """A plan judged in one model for one objective (seconds). ``objective_value`` is
    ``latency_s`` or ``time_per_sample_s``; ``valid`` is False when the plan breaks the
    model's rules (``violations`` says how: memory, contiguity, acyclicity, co-location)."""

    model: str
    objective: str
    microbatches: int | None
    latency_s: float
    bottleneck_s: float
    time_per_sample_s: float
    objective_value: float
    device_load_s: np.ndarray
    link_load_s: np.ndarray | None
    memory_bytes: np.ndarray
    violations: list = field(default_factory=list)
    sim: SimResult | None = None
    stages: StageResult | None = None

    @property
    def valid(self) -> bool:
        return not self.violations

    def to_dict(self) -> dict:
        out = {"model": self.model, "objective": self.objective, "microbatches": self.microbatches,
               "objective_value": self.objective_value, "latency_s": self.latency_s,
               "bottleneck_s": self.bottleneck_s, "time_per_sample_s": self.time_per_sample_s,
               "device_load_s": self.device_load_s.tolist(), "memory_bytes": self.memory_bytes.tolist(),
               "valid": self.valid, "violations": list(self.violations)}
        if self.link_load_s is not None:
            out["max_link_load_s"] = float(self.link_load_s.max()) if self.link_load_s.size else 0.0
        if self.stages is not None:
            out["stages"] = self.stages.summary()["stages"]
        return out


def evaluate(problem: Problem, plan: Plan, model: str = "op", objective: str = "latency",
             microbatches: int | None = None) -> Evaluation:
    """Judge ``plan`` (module docstring).

    Raises
    ------
    PlanError
        If the plan is malformed, or (op model) its orders deadlock.
    InfeasibleError
        If (op model) a node sits where it cannot run.

    Examples
    --------
    >>> from tvm_pesto.bench.random_dag import dnn_like_problem
    >>> problem = dnn_like_problem(12, cluster="2xV100-nvlink")   # 12 ops, 2 GPUs
    >>> from tvm_pesto.solve import solve
    >>> plan = solve(problem, "stage-dp", model="stage", objective="throughput")
    >>> ev = evaluate(problem, plan, "stage", "throughput")
    >>> ev.valid, ev.objective_value > 0
    (True, True)
    """
    model, objective, microbatches = check_choice(model, objective, microbatches)
    if model == "op":
        sim = simulate(problem, plan, check_memory=False)
        busy, links = op_loads(problem, sim)
        bottleneck = float(max(busy.max(initial=0.0), links.max(initial=0.0)))
        latency = float(sim.makespan)
        memory = np.asarray(sim.peak_memory, dtype=np.float64)
        violations = [{"kind": "memory", "device": int(k), "memory_bytes": float(memory[k]),
                       "capacity_bytes": float(problem.capacity[k]),
                       "message": f"{problem.cluster.devices[k].name} needs {memory[k] / 2**20:.1f} MiB (received "
                                  f"tensors included) but has {problem.capacity[k] / 2**20:.1f} MiB"}
                      for k in np.flatnonzero(memory > problem.capacity * (1 + _TOL)).tolist()]
        for grp in problem.colocate:
            if len({int(plan.assignment[v]) for v in grp}) > 1:
                violations.append({"kind": "colocation", "nodes": [problem.graph.nodes[v].name for v in grp],
                                   "message": "co-located nodes are split over several devices; put them on one"})
        stages = None
    else:
        stages = evaluate_stages(problem, plan, pooled=problem.pooled(model, objective, microbatches))
        sim, busy, links = None, stages.device_load_s, None
        bottleneck, latency, memory = stages.bottleneck_s, stages.latency_s, stages.memory_bytes
        violations = stages.violations
    tps = time_per_sample(latency, bottleneck, microbatches)
    value = latency if objective == "latency" else tps
    return Evaluation(model, objective, microbatches, latency, bottleneck, tps, float(value), busy, links, memory,
                      violations, sim, stages)


__all__ = ["Evaluation", "MODELS", "OBJECTIVES", "check_choice", "evaluate", "op_loads", "time_per_sample"]
