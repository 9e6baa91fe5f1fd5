"""Place, build and run a training step: :func:`build_trainer` and :class:`Trainer`.

The step is an ordinary module for the one flow: :func:`tvm_pesto.api.place` places it
(candidates, costs, solver) with the training co-location groups
(:func:`~tvm_pesto.train.constraints.training_colocation`) as ``JointProblem.colocate``,
and the devices' memory as every placement's; :func:`~tvm_pesto.builder.rewrite.apply_plan`
outlines the per-device segments with the step's state pairs, so parameters, BatchNorm
statistics and optimizer state are declared on the device that reads them and their new
values are returned there; :class:`~tvm_pesto.builder.placed.PlacedModule` compiles one
module per device and runs them with the executor. The :class:`Trainer` hands the state to
the module once (:meth:`~tvm_pesto.run.runtime.PlacedRuntime.set_state`) and then calls
:meth:`~tvm_pesto.run.runtime.PlacedRuntime.step` per training step: only the batch goes
in and only the loss comes out.

Memory. The simulator's memory model is static (``plan/reference.py``): a device holds,
for the whole step, the weights of its ops (each parameter, BatchNorm statistic and
optimizer state once, at its first reader), every output its ops make, and every tensor
it receives. The activations the backward pass reads are outputs of forward ops, so they
are counted on their device from the forward op to the end of the step, which includes
"until their last use" in the backward pass; the count is an upper bound of a liveness
count because it also keeps temporaries that die early. ``peak_memory_bytes`` is that
count per device, and it is what the solvers keep within each device's memory.

Examples
--------
>>> import torch
>>> from tvm_pesto.train import build_trainer
>>> _ = torch.manual_seed(0)
>>> net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
>>> tr = build_trainer((net, (torch.randn(16, 8),)), "cross_entropy", "sgd", "cpu:2", costs="roofline")
>>> res = tr.fit(5)
>>> len(res["losses"]), len(res["step_s"])
(5, 5)
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..api import analyze, as_cluster, place
from ..builder.placed import PlacedModule
from ..builder.rewrite import apply_plan
from ..errors import TrainingError
from .backbone import Backbone, make_backbone
from .choices import make_loss, make_optimizer
from .constraints import group_summary, training_colocation
from .data import synthetic_targets
from .step import TrainStep, make_step

__all__ = ["Trainer", "build_step", "build_trainer", "place_step"]


def build_step(model, loss: str = "auto", optimizer: str = "sgd", lr: float | None = None, size: str = "small",
               batch: int | None = None) -> TrainStep:
    """The training step of ``model`` (zoo name, ZooModel, ``(torch_module, inputs)`` or a
    :class:`Backbone`) as one Relax function (:func:`tvm_pesto.train.step.make_step`).

    Raises
    ------
    TrainingError
        For a model without trainable parameters, an unknown loss or optimizer, or a loss
        that does not fit the model's output.
    """
    backbone = model if isinstance(model, Backbone) else make_backbone(model, size=size, batch=batch)
    opt = make_optimizer(optimizer, lr) if isinstance(optimizer, str) else optimizer
    lc = make_loss(loss, backbone.output_type)
    return make_step(backbone, lc, opt)


@dataclass
class Trainer:
    """A placed, built training step with its state on the devices.

    Attributes
    ----------
    step : TrainStep
    placement : Placement
        What the flow decided (``plan``, ``problem``, ``sim``: the simulated step).
    module : PlacedModule
        One compiled module per device; holds the state between steps.
    colocate : list of list of int
        The training co-location groups given to the solver.
    """

    step: TrainStep
    placement: object
    module: object
    colocate: list

    def __post_init__(self):
        self.reset()

    @property
    def devices_used(self) -> list[int]:
        return self.module.devices_used

    @property
    def simulated_step_s(self) -> float:
        return float(self.placement.sim.run_s)

    @property
    def peak_memory_bytes(self) -> list[float]:
        """Simulated static memory per device (see the module docstring)."""
        return [float(m) for m in self.placement.sim.peak_memory]

    def reset(self) -> None:
        """Put the initial parameters, states and optimizer state on their devices."""
        self.module.set_state(self.step.carried_init)

    def batch(self, seed: int = 0) -> tuple:
        """The synthetic batch: the model's example inputs and seeded targets."""
        return tuple(self.step.backbone.inputs), synthetic_targets(self.step.loss, seed)

    def train_step(self, inputs, targets, trace: list | None = None) -> float:
        """One step on a batch; returns its loss (the state stays on the devices)."""
        loss = self.module.step(*inputs, targets, trace=trace)
        return float(loss.numpy())

    def fit(self, steps: int, inputs=None, targets=None, progress=None) -> dict:
        """``steps`` steps on one batch (default: :meth:`batch`).

        Returns
        -------
        dict
            ``losses`` (per step) and ``step_s`` (wall-clock seconds per step).
        """
        if steps < 1:
            raise TrainingError(f"steps must be >= 1, not {steps}")
        if inputs is None or targets is None:
            inputs, targets = self.batch()
        losses, times = [], []
        for k in range(steps):
            t = time.perf_counter()
            losses.append(self.train_step(inputs, targets))
            times.append(time.perf_counter() - t)
            if progress:
                progress(k + 1, steps, losses[-1])
        return {"losses": losses, "step_s": times}

    def state(self) -> dict[str, np.ndarray]:
        """Current parameters, states and optimizer state by name (copied to the host)."""
        return dict(zip(self.step.carried_names, self.module.state()))

    def parameters(self) -> dict[str, np.ndarray]:
        """Current trainable parameters by PyTorch name."""
        values = self.module.state()
        return dict(zip(self.step.backbone.param_names, values[:self.step.num_params]))

    def summary(self) -> dict:
        pl = self.placement
        return {"model": self.step.backbone.name, "loss": self.step.loss.name,
                "optimizer": type(self.step.optimizer).__name__.lower(), "cluster": pl.joint.cluster.name,
                "solver": pl.plan.solver, "solver_status": pl.solver_status, "cost_source": pl.costs.source,
                "num_ops": pl.analysis.op_graph.num_nodes, "num_units": pl.problem.num_nodes,
                "num_params": self.step.num_params, "num_states": self.step.num_states,
                "colocation": group_summary(self.colocate, pl.analysis.op_graph.num_nodes),
                "devices_used": self.devices_used, "num_segments": len(self.module.program.calls()),
                "simulated_step_s": self.simulated_step_s, "peak_memory_bytes": self.peak_memory_bytes}

    def close(self) -> None:
        self.module.close()


def build_trainer(model, loss: str = "auto", optimizer: str = "sgd", cluster="cpu:2", backends="tvm",
                  costs="auto", solver: str = "auto", lr: float | None = None, size: str = "small",
                  batch: int | None = None, cache=None, progress=None, deterministic: bool | None = None,
                  **solver_options) -> Trainer:
    """Build a training step for ``model``, place it on ``cluster`` and compile it.

    Parameters
    ----------
    model : str, ZooModel, (torch.nn.Module, inputs), Backbone or TrainStep
        What to train; a zoo name uses preset ``size``; a TrainStep is placed as it is
        (``loss``, ``optimizer``, ``lr``, ``size`` and ``batch`` are then not used).
    loss : {"auto", "mse", "l1", "cross_entropy", "categorical_cross_entropy"}
    optimizer : {"sgd", "momentum", "adam"} or a TVM Optimizer
    cluster : Cluster or str
    backends, costs, solver, cache, deterministic, **solver_options
        As for :func:`tvm_pesto.api.place`.
    lr : float, optional
        Learning rate (default per optimizer, :data:`tvm_pesto.train.choices.DEFAULT_LR`).
    batch : int, optional
        Batch size (default: the zoo's example batch).
    progress : callable(done, total), optional

    Returns
    -------
    Trainer
        With the initial state on the devices.

    Raises
    ------
    TrainingError
        For a model without trainable parameters, an unknown loss or optimizer, a loss that
        does not fit the output, or an operator without a gradient.
    """
    cluster = as_cluster(cluster)
    step = model if isinstance(model, TrainStep) else build_step(model, loss, optimizer, lr=lr, size=size,
                                                                 batch=batch)
    pl, groups = place_step(step, cluster, backends=backends, solver=solver, costs=costs, cache=cache,
                            progress=progress, deterministic=deterministic, **solver_options)
    placed = apply_plan(pl.analysis.rg, pl.plan, cluster, state=step.carry)
    module = PlacedModule(placed, cluster, pl.plan, pl, progress=progress)
    return Trainer(step, pl, module, groups)


def place_step(step: TrainStep, cluster, backends="tvm", solver: str = "auto", costs="auto", **place_options):
    """Place a training step with its co-location groups (:func:`tvm_pesto.api.place`),
    without building it (e.g. on a cluster that is not on this machine).

    Returns
    -------
    (Placement, list of list of int)
        The placement and the co-location groups it honours.
    """
    analysis = analyze(step.mod)
    groups = training_colocation(step, analysis.rg)
    return place(analysis, cluster, backends=backends, solver=solver, costs=costs, colocate=groups,
                 **place_options), groups
