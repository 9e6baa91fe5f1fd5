"""``tvm-pesto bench training``: the step time of every solver's plan for training steps.

For each model, the training step (:func:`tvm_pesto.train.build_step`) is placed by every
solver with the training co-location groups; on the CPU cluster each plan is built and run
(steps of every plan interleaved, the first of each left out, so a change in the machine's
load hits all plans alike) and its measured median step is put next to the simulated one;
on the GPU presets the same steps are placed and simulated only (costs predicted).

Examples
--------
Not run as a doctest: it builds and times every solver's plan, which takes minutes.

>>> from tvm_pesto.bench.training import TrainingBenchSettings, bench_training  # doctest: +SKIP
>>> res = bench_training(["mlp_mixer"], settings=TrainingBenchSettings(steps=5))  # doctest: +SKIP
>>> res["models"]["mlp_mixer"]["cpu"]["ilp"]["measured_step_s"]  # doctest: +SKIP
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..cluster.linkbench import measure_links
from .report import fmt, machine_info, markdown_table

MODELS = ("mlp_mixer", "bert", "resnet50")
SOLVERS = ("single", "m-etf", "m-sct", "heft", "ilp")
GPU_CLUSTERS = ("2xV100-nvlink", "4xV100-pcie", "4xA100-nvlink")

__all__ = ["GPU_CLUSTERS", "MODELS", "SOLVERS", "TrainingBenchSettings", "bench_model", "bench_training", "training_markdown"]


def _measure(trainers: dict, steps: int) -> dict:
    """Median seconds per step of each trainer, steps interleaved; the losses of each."""
    times = {k: [] for k in trainers}
    losses = {k: [] for k in trainers}
    batch = {k: tr.batch() for k, tr in trainers.items()}
    for _ in range(steps + 1):  # the first step of each plan warms it up
        for k, tr in trainers.items():
            t = time.perf_counter()
            losses[k].append(tr.train_step(*batch[k]))
            times[k].append(time.perf_counter() - t)
    return {k: {"measured_step_s": float(np.median(v[1:])), "measured_min_step_s": float(np.min(v[1:])),
                "losses": losses[k]} for k, v in times.items()}


@dataclass(frozen=True)
class TrainingBenchSettings:
    """What ``bench training`` places, runs and simulates.

    Attributes
    ----------
    size : {"small", "full"}
        Size of the zoo models.
    solvers : sequence of str
        The solvers whose plans are compared.
    gpu_clusters : sequence of str
        GPU presets the plans are simulated on (costs predicted).
    steps : int
        Timed steps per plan (after one warm-up step).
    optimizer : {"sgd", "momentum", "adam"}
        The training step's optimizer.
    costs : str
        Cost source on the CPU cluster.
    gpu_costs : str
        Cost source on the GPU presets.
    """

    size: str = "small"
    solvers: tuple = SOLVERS
    gpu_clusters: tuple = GPU_CLUSTERS
    steps: int = 10
    optimizer: str = "sgd"
    costs: str = "auto"
    gpu_costs: str = "auto"


def bench_model(name: str, cluster: str = "cpu:2", settings: TrainingBenchSettings = TrainingBenchSettings(),
                progress=None) -> dict:
    """Every solver's plan of one model's training step: built, run and simulated on
    ``cluster``, simulated on each of ``settings.gpu_clusters``."""
    # lazy: loads TVM's compiler, which importing this module does not
    from ..api import as_cluster
    from ..train import build_step, build_trainer, place_step

    solvers, optimizer = settings.solvers, settings.optimizer
    say = progress or (lambda m: None)
    cl = as_cluster(cluster)
    step = build_step(name, optimizer=optimizer, size=settings.size)
    out: dict = {"model": step.backbone.name, "optimizer": optimizer, "cpu": {}, "gpu": {}}
    trainers = {}
    try:
        for s in solvers:
            t0 = time.perf_counter()
            tr = build_trainer(step, cluster=cl, costs=settings.costs, solver=s)
            trainers[s] = tr
            out["cpu"][s] = {"devices_used": tr.devices_used, "simulated_step_s": tr.simulated_step_s,
                             "peak_memory_bytes": tr.peak_memory_bytes, "solve_s": float(tr.placement.plan.solve_s),
                             "solver_status": tr.placement.solver_status, "build_s": time.perf_counter() - t0,
                             "cost_source": tr.placement.costs.source}
            say(f"{name} {s}: simulated {tr.simulated_step_s * 1e3:.3f} ms on devices {tr.devices_used}")
        pl = next(iter(trainers.values())).placement
        out["num_ops"], out["num_units"] = pl.analysis.op_graph.num_nodes, pl.problem.num_nodes
        load = machine_info()["load_average"]
        for s, r in _measure(trainers, settings.steps).items():
            out["cpu"][s].update(r)
            out["cpu"][s]["measured_over_simulated"] = r["measured_step_s"] / out["cpu"][s]["simulated_step_s"]
        out["load_average"] = [load, machine_info()["load_average"]]
    finally:
        for tr in trainers.values():
            tr.close()
    for spec in settings.gpu_clusters:
        out["gpu"][spec] = {}
        for s in solvers:
            pl, _ = place_step(step, spec, solver=s, costs=settings.gpu_costs)
            out["gpu"][spec][s] = {"simulated_step_s": float(pl.sim.makespan), "devices_used": pl.plan.devices_used(),
                                   "cost_source": pl.costs.source,
                                   "peak_memory_bytes": [float(m) for m in pl.sim.peak_memory]}
        say(f"{name} on {spec}: " + ", ".join(f"{s} {r['simulated_step_s'] * 1e3:.3f} ms"
                                              for s, r in out["gpu"][spec].items()))
    return out


def bench_training(models=MODELS, cluster: str = "cpu:2", settings: TrainingBenchSettings = TrainingBenchSettings(),
                   progress=None) -> dict:
    """:func:`bench_model` for every model, with the machine's facts before and after."""
    # lazy: loads TVM's compiler, which importing this module does not
    from ..api import as_cluster

    cl = as_cluster(cluster)
    if cl.all_present and cl.num_devices > 1:
        measure_links(cl)  # the simulator's transfers then cost what this machine's copies cost
    st = settings
    out = {"size": st.size, "cluster": cl.name, "solvers": list(st.solvers), "gpu_clusters": list(st.gpu_clusters),
           "steps": st.steps, "optimizer": st.optimizer, "costs": st.costs, "gpu_costs": st.gpu_costs,
           "links": {"latency_s": cl.latency.tolist(), "bandwidth_Bps": cl.bandwidth.tolist()},
           "machine": machine_info(), "models": {}}
    for name in models:
        out["models"][name] = bench_model(name, cl, settings, progress)
    out["machine_after"] = machine_info()
    return out


def training_markdown(res: dict) -> str:
    """Two tables: measured vs simulated step per solver on the CPU cluster; simulated step
    per solver on each GPU preset."""
    ms = lambda s: fmt(s * 1e3 if s is not None else None, ".2f")  # noqa: E731
    rows = []
    for name, m in res["models"].items():
        base = m["cpu"].get("single", {}).get("measured_step_s")
        for s, r in m["cpu"].items():
            mem = " / ".join(f"{b / 2**20:.1f}" for b in r["peak_memory_bytes"])
            rows.append([name, s, ",".join(map(str, r["devices_used"])), ms(r["simulated_step_s"]),
                         ms(r.get("measured_step_s")), fmt(r.get("measured_over_simulated"), ".2f"),
                         fmt(base / r["measured_step_s"] if base and r.get("measured_step_s") else None, ".2f"),
                         mem, fmt(r["solve_s"], ".1f")])
    cpu = markdown_table(["model", "solver", "devices", "simulated ms", "measured ms", "measured/sim",
                          "speedup vs single (measured)", "peak MiB per device", "solve s"], rows,
                         align="llrrrrrrr")
    grows = []
    solvers = res["solvers"]
    for name, m in res["models"].items():
        for spec, by in m["gpu"].items():
            grows.append([name, spec] + [f"{ms(by[s]['simulated_step_s'])} ({len(by[s]['devices_used'])})"
                                         for s in solvers])
    gpu = markdown_table(["model", "cluster"] + [f"{s} ms (devices)" for s in solvers], grows,
                         align="ll" + "r" * len(solvers))
    return cpu + "\n\n" + gpu
