"""The options of the final choice (:mod:`tvm_pesto.choose`): the flow's plan, its plan on
the same cores as one device, and each library's whole model, and whether they can be timed here.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import numpy as np

from ..cluster.specs import cpu_cluster
from ..errors import InfeasibleError, PestoError
from ..plan import JointProblem, simulate
from ..solve.joint.solver import solve_joint
from .claim import same_plan

#: Environment variable: ``0`` makes ``build(measure_final=None)`` keep the flow's plan unmeasured.
MEASURE_ENV = "TVM_PESTO_MEASURE_FINAL"


def one_device_cluster():
    """The one-device shape of this machine's cores (``cpu:1``, every core in it), on which
    the flow is placed again for the ``one-device`` option."""
    return cpu_cluster(1)


@dataclass
class Option:
    """One way to run the model: ``placement`` on ``cluster``."""

    name: str
    cluster: object
    placement: object
    predicted_s: float


def measure_final_default() -> bool:
    """Whether ``build`` measures its final choice when not told (:data:`MEASURE_ENV`)."""
    if (v := os.environ.get(MEASURE_ENV, "1").strip().lower() or "1") not in ("0", "1", "off", "on"):
        raise PestoError(f"${MEASURE_ENV} is {v!r}; set it to 1 (measure the final choice) or 0 (keep the flow's plan)")
    return v in ("1", "on")


def why_not_measured(cluster) -> str | None:
    """Why the options cannot be timed on ``cluster`` here (None: they can)."""
    preset = str(cluster.meta.get("preset", ""))
    if not preset.startswith("cpu:"):
        return f"{cluster.name} is not this machine's CPU cores (cpu:N); its plan is kept as the flow chose it"
    if not all(d.present and d.kind == "cpu" and not d.rpc_key for d in cluster.devices):
        return f"a device of {cluster.name} is not on this machine"
    return None


def skip_reason(cluster, measure_final: bool | None = None) -> str | None:
    """Why the final choice on ``cluster`` is not measured (None: it is); ``measure_final``
    None takes :func:`measure_final_default`."""
    measure = measure_final_default() if measure_final is None else bool(measure_final)
    return why_not_measured(cluster) if measure else "measure_final is off"


#: A library that cannot take the whole model is offered around the ops it lacks (those in TVM)
#: where it runs at least this share of the model's ops.
AROUND_SHARE = 0.8

#: Backends whose whole model is its fusion groups, one unit each (what ``tvm.compile`` of the
#: module builds), not one library call.
GROUPED = ("tvm",)


def whole_model_placement(placement, backend: str, cluster):
    """The placement of the whole model in ``backend`` alone on ``cluster``'s device 0 (the
    flow's solver on a cost table where only that backend's candidates on device 0 are
    finite: for a library, its one whole-model candidate; for a :data:`GROUPED` backend,
    every candidate of it), or None (no such cover, or a library call that would not build
    within the placement's build budget)."""
    n = placement.analysis.op_graph.num_nodes
    table = placement.costs.table
    if backend in GROUPED:
        keep = [i for i, c in enumerate(placement.candidates) if c.backend == backend and np.isfinite(table[i, 0])]
    else:
        keep = [i for i, c in enumerate(placement.candidates)
                if c.backend == backend and len(c.nodes) == n and np.isfinite(table[i, 0])][:1]
        budget = placement.plan.info.get("build_budget")
        if keep and budget and placement.build_s is not None and placement.build_s[keep[0], 0] > budget["max_build_s"]:
            return None  # it would not build within the budget
    return _alone(placement, keep, cluster, f"library:{backend}")


def library_around_placement(placement, backend: str, cluster):
    """The whole model in library ``backend`` around the ops it cannot run, those in TVM's
    fusion groups on the same device (``cluster``'s device 0), for a library that has no
    whole-model candidate (an op its exporter cannot take) but runs at least
    :data:`AROUND_SHARE` of the ops; None otherwise. The cover is the flow's cheapest on
    the library's and TVM's candidates alone: a user's library with the few calls it lacks
    done by TVM, what a model the library cannot take whole runs at best in it."""
    n = placement.analysis.op_graph.num_nodes
    table = placement.costs.table
    if backend in GROUPED:
        return None
    lib = [i for i, c in enumerate(placement.candidates) if c.backend == backend and np.isfinite(table[i, 0])]
    if not lib or any(len(placement.candidates[i].nodes) == n for i in lib):
        return None  # not this library, or its whole model is the option (whole_model_placement)
    if len(set().union(*(placement.candidates[i].nodes for i in lib))) < AROUND_SHARE * n:
        return None
    tvm = [i for i, c in enumerate(placement.candidates) if c.backend == "tvm" and np.isfinite(table[i, 0])]
    return _alone(placement, lib + tvm, cluster, f"library:{backend}+tvm")


def _alone(placement, keep: list[int], cluster, solver: str):
    """``placement`` solved again on device 0 of ``cluster`` with only the candidates ``keep``
    (the rest priced infinite; what was measured or predicted for those, as reported), its
    plan named ``solver``; None when they do not cover every op."""
    table = placement.costs.table
    if not keep:
        return None
    masked = np.full_like(table, np.inf)
    masked[keep, 0] = table[keep, 0]
    ct = dataclasses.replace(placement.costs, table=masked)  # what was measured or predicted, as reported
    try:  # (a device pin can leave no candidate of a node on device 0)
        jp = JointProblem(placement.analysis.op_graph, cluster, list(placement.candidates), masked,
                          cost_source=placement.costs.source)
        plan, problem = solve_joint(jp, solver="single", search_s=0)
    except InfeasibleError:  # the backend's candidates do not cover every op
        return None
    plan.solver = solver
    return dataclasses.replace(placement, costs=ct, joint=jp, problem=problem, plan=plan, sim=simulate(problem, plan))


def make_options(placement, cluster, one_device=None, wide: bool = True) -> list[Option]:
    """The options to measure: the flow's plan, the one-device plan, the whole-model
    library plans (see :mod:`tvm_pesto.choose`). ``one_device`` is the flow's placement on
    ``cpu_cluster(1)`` (:func:`one_device_cluster`), given where ``cluster`` has several
    devices. A library plan that is the flow's plan on its
    shape already (the flow chose that library for the whole model) is not listed twice:
    the flow's option stands for it. ``wide=False`` leaves out the options on the one-device
    shape (constraints that name a device of ``cluster`` bind no other shape). Every option
    is solved on ``placement``'s candidates and costs (or ``one_device``'s), so none breaks a
    pin or forbid the flow was given (:mod:`tvm_pesto.constraints`)."""
    out = [Option("plan", cluster, placement, float(placement.sim.run_s))]
    libraries = []
    if cluster.num_devices == 1 or wide:
        wide_c, wide_pl = cluster, placement
        if cluster.num_devices > 1:
            if one_device is None:
                raise PestoError(f"{cluster.name} has {cluster.num_devices} devices: give the flow's placement on one "
                                 "device of the same cores (one_device=)")
            wide_c, wide_pl = one_device.joint.cluster, one_device
            out.append(Option("one-device", wide_c, wide_pl, float(wide_pl.sim.run_s)))
        backends = sorted({c.backend for c in wide_pl.candidates})
        libraries += [(f"library:{b}", wide_c, whole_model_placement(wide_pl, b, wide_c)) for b in backends]
        libraries += [(f"library:{b}+tvm", wide_c, library_around_placement(wide_pl, b, wide_c)) for b in backends]
    if cluster.num_devices > 1:  # the library on one of the narrow devices (one thread on cpu:N)
        narrow = cluster.devices[0]
        libraries += [(f"library:{b} on {narrow.name}", cluster, whole_model_placement(placement, b, cluster))
                      for b in sorted({c.backend for c in placement.candidates})]
    for name, c, lp in libraries:
        if lp is not None and not any(same_plan(o, c, lp) for o in out):
            out.append(Option(name, c, lp, float(lp.sim.run_s)))
    return out


def library_call(option: Option) -> bool:
    """Whether ``option`` runs the whole model as one library call: a ``library:`` option (not
    a library around TVM's calls, ``library:<b>+tvm``), or a flow's plan of one unit (the flow
    chose one library for every op; :func:`make_options` then lists no library option beside it)."""
    units = getattr(option.placement.plan, "units", None) or []
    return (option.name.startswith("library:") and not option.name.endswith("+tvm")) or len(units) == 1


__all__ = ["AROUND_SHARE", "GROUPED", "MEASURE_ENV", "Option", "library_around_placement", "library_call", "measure_final_default", "one_device_cluster",
           "make_options", "skip_reason", "whole_model_placement", "why_not_measured"]
