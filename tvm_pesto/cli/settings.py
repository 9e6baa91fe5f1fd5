"""The settings records of the ``run`` and ``place`` verbs (:mod:`tvm_pesto.cli.commands`),
besides what :class:`tvm_pesto.placing.Request` holds."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RunSettings:
    """How ``tvm-pesto run`` loads, measures, runs and reports a placed model
    (:func:`tvm_pesto.cli.commands.run_model`).

    Attributes
    ----------
    repeat : int
        Timed runs, at least (more until they last 0.2 s).
    refit : bool
        Measure the executor's links, dispatch and contention on this machine again now and
        keep them (default: the fit kept for this machine, measured on first use).
    trace_dir : str, optional
        Folder for the Gantt chart and Chrome traces.
    export_dir : str, optional
        Folder to write the placed model to as a bundle (:func:`tvm_pesto.load` runs it).
    report_dir : str, optional
        Folder for the report of where every node ran and why (``report.html``, ``report.json``,
        ``nodes.csv``: :meth:`tvm_pesto.builder.placed.PlacedModule.report`).
    input_shapes : dict, optional
        Input name -> static shape, for model inputs whose shape is dynamic.
    ray_address : str, optional
        An existing Ray cluster for ``executor="ray"`` (None: a local one on 127.0.0.1).
    rpc_tracker : str, optional
        A TVM RPC tracker (``host:port``) to measure the costs on a remote device.
    rpc_key : str, optional
        The remote device's key at the tracker.
    """

    repeat: int = 20
    refit: bool = False
    trace_dir: str | None = None
    export_dir: str | None = None
    report_dir: str | None = None
    input_shapes: dict | None = None
    ray_address: str | None = None
    rpc_tracker: str | None = None
    rpc_key: str | None = None


@dataclass(frozen=True)
class PlaceSettings:
    """What ``tvm-pesto place`` places with besides the target, the cluster and the solvers
    (:func:`tvm_pesto.cli.commands.place_any`).

    Attributes
    ----------
    size : {"small", "full"}
        Size of a zoo model.
    costs : str
        Cost source of a model's candidates (:data:`tvm_pesto.costs.SOURCES`).
    backends : str
        The backends whose candidates are placed.
    input_shapes : dict, optional
        Input name -> static shape, for model inputs whose shape is dynamic.
    expert : str, optional
        A human-expert split file of a LayerGraph, validated and judged as a baseline.
    time_limit_s : float
        Each solver's time limit (deterministic mode: nominal seconds of work).
    deterministic : bool
        Work budgets instead of wall-clock ones, so the plans are the same on any machine.
    model : {"op", "stage"}, optional
        Execution model (None: ``stage`` for LayerGraph files, else ``op``).
    objective : {"latency", "throughput"}
        What the plans are judged and optimised on.
    microbatches : int, optional
        Microbatches in flight for the throughput objective (None: steady state).
    split_margin : float, optional
        How much faster a split plan must be than the one-device plan (the op model's latency only).
    max_build_s : float, optional
        Seconds of library builds each plan may need.
    constraints : Constraints, optional
        Pins, forbids and device memory caps every plan honours (:mod:`tvm_pesto.constraints`).
    report_dir : str, optional
        Folder for the report of the best plan of a model (``report.html``, ``report.json``,
        ``nodes.csv``; predicted only: ``place`` builds and runs nothing).
    """

    size: str = "small"
    costs: str = "auto"
    backends: str = "all"
    input_shapes: dict | None = None
    expert: str | None = None
    time_limit_s: float = 30.0
    deterministic: bool = True
    model: str | None = None
    objective: str = "latency"
    microbatches: int | None = None
    split_margin: float | None = None
    max_build_s: float | None = None
    constraints: object = None
    report_dir: str | None = None


__all__ = ["PlaceSettings", "RunSettings"]
