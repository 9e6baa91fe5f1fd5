"""``tvm-pesto train``: place and run whole training steps of a model across devices.

Builds the model's training step (forward, loss, backward, optimizer update in one Relax
function, :mod:`tvm_pesto.train`), places it with the training co-location constraints,
builds one module per device, checks one step's gradients against PyTorch autograd, and
runs ``--steps`` steps of a learnable synthetic task (the model's seeded batch with fixed
random targets) with the parameters and optimizer state kept on their devices.

Registered in ``tvm_pesto/cli/main.py`` with one line.

JSON (``--json``): ``losses`` (per step), ``grad_max_rel_err`` (worst parameter's
norm-wise error against autograd, :func:`tvm_pesto.train.check.gradient_check`),
``devices_used`` (how many devices run a segment; ``devices``: which),
``measured_step_s`` (median wall-clock step), ``simulated_step_s`` (the plan simulated),
``peak_memory_bytes`` (per device, the simulator's static count: see
:mod:`tvm_pesto.train.trainer`), the plan and the machine's load average.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

import click
import numpy as np
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ..cluster import parse_cluster
from ..cluster.linkbench import measure_links
from ..costs import SOURCES
from ..errors import TrainingError
from ..jsonio import write_json
from ..plan.trace import write_trace_dir
from .options import deterministic_option
from .progress import console, step


@click.command("train")
@click.argument("model")
@click.option("--size", default="small", show_default=True, type=click.Choice(["small", "full"]))
@click.option("--cluster", "cluster_spec", default="cpu:2", show_default=True)
@click.option("--steps", default=20, show_default=True, help="training steps to run")
@click.option("--optimizer", default="sgd", show_default=True, type=click.Choice(["sgd", "momentum", "adam"]))
@click.option("--loss", default="auto", show_default=True,
              type=click.Choice(["auto", "mse", "l1", "cross_entropy", "categorical_cross_entropy"]),
              help="auto: cross_entropy for (batch, classes) outputs, mse otherwise")
@click.option("--lr", default=None, type=float, help="learning rate [default: sgd 0.1, momentum 0.02, adam 0.001]")
@click.option("--batch", default=None, type=int, help="batch size [default: the zoo model's example batch]")
@click.option("--solver", default="ilp", show_default=True,
              help="placement solver (ilp, heft, m-etf, m-sct, m-topo, single)")
@click.option("--costs", default="auto", show_default=True, type=click.Choice(list(SOURCES)),
              help="auto: measured when every device is on this machine")
@click.option("--backends", default="tvm", show_default=True,
              help="tvm (placement without backend choice) or a backend list as for tvm-pesto run")
@click.option("--check/--no-check", default=True, show_default=True,
              help="compare one step's gradients with PyTorch autograd")
@click.option("--compare-single", is_flag=True,
              help="also run the same steps on one device and report the largest relative loss difference")
@click.option("--trace-dir", default=None, help="write the Gantt chart and Chrome traces of one step here")
@click.option("--json", "json_path", default=None, help="write the result as JSON here")
@deterministic_option(False)
def train(model, cluster_spec, json_path, **options):
    """Train MODEL (a zoo name) for --steps steps with its step placed over --cluster."""
    res = run_training(model, cluster_spec, TrainSettings(**options))
    _print(res)
    if json_path:
        write_json(json_path, res, schema="train")


@dataclass(frozen=True)
class TrainSettings:
    """What ``tvm-pesto train`` trains with and reports (:func:`run_training`).

    Attributes
    ----------
    size : {"small", "full"}
        Size of the zoo model.
    steps : int
        Training steps to run (at least 1).
    optimizer : {"sgd", "momentum", "adam"}
        The optimizer of the training step.
    loss : str
        The loss (``auto``: cross entropy for ``(batch, classes)`` outputs, else mse).
    lr : float, optional
        Learning rate (None: the optimizer's default).
    batch : int, optional
        Batch size (None: the zoo model's example batch).
    solver : str
        Placement solver of the step.
    costs : str
        Cost source (:data:`tvm_pesto.costs.SOURCES`).
    backends : str
        ``tvm`` (placement without backend choice) or a backend list.
    check : bool
        Compare one step's gradients with PyTorch autograd.
    compare_single : bool
        Also run the same steps on one device and report the largest relative loss difference.
    trace_dir : str, optional
        Folder for the Gantt chart and Chrome traces of one step.
    deterministic : bool
        Work budgets instead of wall-clock ones when placing.
    """

    size: str = "small"
    steps: int = 20
    optimizer: str = "sgd"
    loss: str = "auto"
    lr: float | None = None
    batch: int | None = None
    solver: str = "ilp"
    costs: str = "auto"
    backends: str = "tvm"
    check: bool = True
    compare_single: bool = False
    trace_dir: str | None = None
    deterministic: bool = False


def run_training(model: str, cluster_spec: str, settings: TrainSettings) -> dict:
    """What ``tvm-pesto train`` does, as a dict (the ``--json`` content)."""
    # lazy: loads TVM's compiler; the CLI imports a verb's code when the verb runs
    from ..train import build_step, build_trainer, gradient_check

    s = settings
    size, steps, solver, backends = s.size, s.steps, s.solver, s.backends

    if steps < 1:
        raise TrainingError(f"--steps must be >= 1, not {steps}")
    cluster = parse_cluster(cluster_spec)
    if cluster.all_present and cluster.num_devices > 1:
        with step("measure links between devices"):
            measure_links(cluster)
    with step("training step: import, gradient, optimizer"):
        train_step = build_step(model, s.loss, s.optimizer, lr=s.lr, size=size, batch=s.batch)
    with step(f"place ({solver}) and build the step") as cb:
        tr = build_trainer(train_step, cluster=cluster, backends=backends, costs=s.costs, solver=solver, progress=cb,
                           deterministic=s.deterministic)
    grad = None
    if s.check:
        with step("gradients against PyTorch autograd"):
            grad = gradient_check(tr.step)
    inputs, targets = tr.batch()
    load_before = _load()
    losses, times, trace = _fit(tr, steps, inputs, targets, "train")
    res = {**tr.summary(), "model": model, "size": size, "cluster": cluster.name,
           "steps": steps, "lr": float(tr.step.optimizer.lr), "batch": int(inputs[0].shape[0]), "losses": losses,
           "loss_last_over_first": losses[-1] / losses[0] if losses[0] else None,
           "grad_max_rel_err": grad["max_rel_err"] if grad else None,
           "grad_worst_param": grad["worst_param"] if grad else None,
           "grad_vanishing_params": grad["vanishing"] if grad else None,
           "loss_torch": grad["loss_torch"] if grad else None,
           "devices": tr.devices_used, "devices_used": len(tr.devices_used),
           "measured_step_s": float(np.median(times)), "measured_min_step_s": float(np.min(times)),
           "step_s": times}
    res["measured_over_simulated"] = res["measured_step_s"] / res["simulated_step_s"]
    res["load_avg_1m"] = [load_before, _load()]
    if s.compare_single:
        with step("the same step on one device (solver single)") as cb:
            single = build_trainer(tr.step, cluster=cluster, backends=backends, costs="roofline", solver="single",
                                   progress=cb)
        s_losses, _, _ = _fit(single, steps, inputs, targets, "single device")
        single.close()
        diff = [abs(a - b) / max(abs(b), 1e-30) for a, b in zip(losses, s_losses)]
        res["single_device_losses"] = s_losses
        res["max_loss_rel_diff_vs_single"] = float(max(diff))
    if s.trace_dir:
        _write_traces(tr, trace, s.trace_dir, res)
    tr.close()
    return res


def _load():
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


def _fit(tr, steps: int, inputs, targets, label: str):
    """Run the steps with a progress bar (loss and step time); trace the last one."""
    losses, times, trace = [], [], []
    with Progress(TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("loss {task.fields[loss]}  {task.fields[ms]} ms/step"), console=console,
                  disable=not console.is_terminal) as prog:
        task = prog.add_task(label, total=steps, loss="-", ms="-")
        for k in range(steps):
            t = time.perf_counter()
            losses.append(tr.train_step(inputs, targets, trace=trace if k == steps - 1 else None))
            times.append(time.perf_counter() - t)
            prog.update(task, advance=1, loss=f"{losses[-1]:.4f}", ms=f"{times[-1] * 1e3:.2f}")
    if not console.is_terminal:
        console.print(f"{label}: {steps} steps, loss {losses[0]:.4f} -> {losses[-1]:.4f}, "
                      f"median {np.median(times) * 1e3:.2f} ms/step")
    return losses, times, trace


def _write_traces(tr, trace, out_dir: str, res: dict) -> None:
    pl = tr.placement
    res["artifacts"] = write_trace_dir(out_dir, pl.problem, pl.plan, pl.sim, trace,
                                       [d.name for d in pl.joint.cluster.devices],
                                       f"{res['model']} training step ({pl.plan.solver})", run_file="step_trace.json")


def _print(res: dict) -> None:
    first, last = res["losses"][0], res["losses"][-1]
    console.print(f"[bold]{res['model']}[/] ({res['size']}) on {res['cluster']}: {res['num_ops']} ops, "
                  f"{res['num_units']} units, solver {res['solver']} ({res['solver_status']}), "
                  f"devices {res['devices']}")
    console.print(f"  loss {first:.4f} -> {last:.4f} (x{last / first:.3f}) over {res['steps']} steps "
                  f"({res['optimizer']}, {res['loss']})")
    if res["grad_max_rel_err"] is not None:
        console.print(f"  gradients vs PyTorch autograd: max rel err {res['grad_max_rel_err']:.2e} "
                      f"({res['grad_worst_param']})")
    console.print(f"  step: measured {res['measured_step_s'] * 1e3:.3f} ms, simulated "
                  f"{res['simulated_step_s'] * 1e3:.3f} ms (x{res['measured_over_simulated']:.2f}); "
                  f"load average {res['load_avg_1m']}")
    mem = ", ".join(f"{m / 2**20:.2f}" for m in res["peak_memory_bytes"])
    console.print(f"  peak memory per device (static count): [{mem}] MiB")
    if "max_loss_rel_diff_vs_single" in res:
        console.print(f"  losses vs one device: max rel diff {res['max_loss_rel_diff_vs_single']:.2e}")


__all__ = ["TrainSettings", "run_training", "train"]
