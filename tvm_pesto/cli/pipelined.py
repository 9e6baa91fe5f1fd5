"""``tvm-pesto run MODEL --objective throughput``: a stage plan streamed through the devices."""
from __future__ import annotations

import os
import time

import numpy as np

from .. import api
from ..builder.placed import PlacedModule
from ..builder.rewrite import apply_plan
from ..cluster import parse_cluster
from ..errors import PestoError
from ..plan.objective import check_choice, evaluate
from ..run.thread.executor import max_abs_err
from ..run.thread.pipeline import microbatch_inputs, run_pipeline
from .commands import _mode, load_target, reference_output
from .progress import step


def run_pipelined(model: str, size: str, cluster_spec: str, microbatches: int = 8, solver: str = "stage-dp",
                  costs: str = "auto", repeat: int = 3, input_shapes=None, deterministic: bool = False) -> dict:
    """``tvm-pesto run MODEL --objective throughput``: place MODEL's fusion groups as a stage
    plan for the time per sample of ``microbatches`` microbatches (:mod:`tvm_pesto.plan.stage`),
    build it, stream the microbatches through the devices (:func:`tvm_pesto.run.thread.pipeline.run_pipeline`)
    and report the measured time per sample (median of ``repeat`` streams) against the
    simulated one and against running the microbatches one by one, and the largest
    difference between pipelined and one-by-one outputs (and the unplaced module's)."""
    _, _, k = check_choice("stage", "throughput", microbatches)
    if k is None:
        raise PestoError("--microbatches must be at least 1 for a pipelined run (0 means steady state, which a "
                         "finite run cannot measure)")
    lm = load_target(model, size, input_shapes)
    cluster = parse_cluster(cluster_spec)
    with step("candidates, costs and stage plan") as cb:
        analysis = api.analyze(lm.mod)
        pl = api.place(analysis, cluster, backends="tvm", solver=solver, costs=costs, progress=cb,
                       deterministic=deterministic, model="stage", objective="throughput", microbatches=k)
    with step(f"build {len(pl.plan.devices_used())} per-device modules") as cb:
        pm = PlacedModule(apply_plan(analysis.rg, pl.plan, cluster), cluster, pl.plan, pl, progress=cb)
    batches = microbatch_inputs(lm.example_inputs, k)
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    try:
        with step(f"run {k} microbatches one by one and pipelined ({repeat} times)"):
            single = [pm(*b) for b in batches]
            ref, _, _ = reference_output(lm.mod, batches[0], cluster.devices[0].target
                                         if cluster.devices[0].kind == "cpu" else None)
            piped, facts = run_pipeline(pm, batches)
            err = max(max_abs_err(a, b) for a, b in zip(piped, single))
            one_by_one, streams = [], []
            for _ in range(max(1, repeat)):
                t = time.perf_counter()
                for b in batches:
                    pm(*b)
                one_by_one.append((time.perf_counter() - t) / k)
                streams.append(run_pipeline(pm, batches)[1]["time_per_sample_s"])
    finally:
        pm.close()
    stage = evaluate(pl.problem, pl.plan, "stage", "throughput", k)
    op = evaluate(pl.problem, pl.plan, "op", "throughput", k)
    measured = float(np.median(streams))
    return {"model": lm.name, "source": lm.source, "size": size if lm.source == "zoo" else None,
            "cluster": cluster.name, "solver": pl.plan.solver, "solver_status": pl.solver_status,
            "objective": "throughput", "model_used": "stage", "microbatches": k, "cost_source": pl.costs.source,
            "num_ops": analysis.op_graph.num_nodes, "num_units": pl.problem.num_nodes,
            "devices_used": pm.devices_used, "stage_plan_valid": stage.valid, "violations": stage.violations,
            "measured_time_per_sample_s": measured, "measured_one_by_one_s": float(np.median(one_by_one)),
            "simulated_time_per_sample_s": stage.time_per_sample_s, "simulated_latency_s": stage.latency_s,
            "simulated_bottleneck_s": stage.bottleneck_s,
            "simulated_op_model_time_per_sample_s": op.time_per_sample_s,
            "measured_over_simulated": measured / stage.time_per_sample_s if stage.time_per_sample_s else None,
            "pipelining_speedup": float(np.median(one_by_one)) / measured if measured else None,
            "max_abs_err_pipelined_vs_one_by_one": err, "max_abs_err_vs_unplaced": max_abs_err(single[0], ref),
            "stream_wall_s": facts["wall_s"],
            "load_avg_1m": [load_before, os.getloadavg()[0] if hasattr(os, "getloadavg") else None],
            **_mode(deterministic, pl.plan.info)}


__all__ = ["run_pipelined"]
