"""What a placement report shows, as typed records built from a placed model.

:func:`build_report` reads a built model (:class:`~tvm_pesto.builder.placed.PlacedModule`:
its ``placement``, ``decision``, ``cluster`` and which units each compiled segment holds)
and one traced run, and returns a :class:`Report`: per op-graph node its unit, backend,
device, simulated and measured times and what each backend's candidates would have cost it
(:class:`NodeRecord`); per unit its predicted and measured time (:class:`UnitRecord`); the
simulated and the measured Gantt bars (:class:`GanttBar`); the final choice's options
(:class:`DecisionOption`). :mod:`tvm_pesto.report.write` writes it as HTML, JSON and CSV.

What a backend "would have cost" a node is the predicted seconds, on the node's device, of
that backend's smallest candidate holding the node (the fewest ops; the cheaper of equals),
and how many ops that candidate runs (``cost_ops``): a backend that runs a node only inside
a larger region is priced for the region. The measured time of a unit is its compiled
segment's time in the traced run when the segment holds that unit alone; a segment of several
units is split between them in proportion to their predicted times (``measured_split``).

Examples
--------
>>> import tvm_pesto
>>> from tvm_pesto.candidates.examples import tiny_cnn
>>> mod, (x,) = tiny_cnn()
>>> placed = tvm_pesto.build(mod, "cpu:2", costs="roofline", measure_final=False)
>>> _, trace = placed.run_traced(x)
>>> rep = build_report(placed, trace, model="tiny_cnn")
>>> len(rep.nodes) == tvm_pesto.analyze(mod).op_graph.num_nodes
True
>>> sorted({n.unit for n in rep.nodes}) == [u.id for u in rep.units]
True
>>> all(u.measured_s is not None for u in rep.units)
True
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass

import numpy as np

from ..errors import PestoError
from ..plan.trace import sim_events, trace_events


class ReportError(PestoError):
    """A report cannot be made of this model (it holds no placement, or its parts disagree)."""


@dataclass(frozen=True)
class NodeRecord:
    """One op-graph node: where it ran and what each backend would have cost it.

    ``start_s``/``end_s`` are its unit's simulated times, ``measured_start_s``/``measured_end_s``
    its unit's segment in the traced run (None when not run); ``costs`` maps every backend
    with candidates to the predicted seconds of its smallest candidate holding the node on
    the node's device (None: none holds it, or none runs there), ``cost_ops`` to that
    candidate's number of ops; ``pinned`` the user's pin that put it there (None: the solver
    chose). Where it runs comes from :meth:`tvm_pesto.plan.placement.Placement.node_table`.
    """

    id: int
    name: str
    op: str
    unit: int
    backend: str
    device: int
    start_s: float
    end_s: float
    measured_start_s: float | None
    measured_end_s: float | None
    costs: dict[str, float | None]
    cost_ops: dict[str, int]
    pinned: str | None = None


@dataclass(frozen=True)
class UnitRecord:
    """One unit of the plan (a candidate the solver chose): its ops, backend and device, its
    simulated schedule and its measured time (see the module's docstring)."""

    id: int
    name: str
    backend: str
    pattern: str
    device: int
    nodes: tuple[int, ...]
    predicted_start_s: float
    predicted_end_s: float
    segment: str | None
    segment_measured_s: float | None
    measured_s: float | None
    measured_split: bool

    @property
    def predicted_s(self) -> float:
        return self.predicted_end_s - self.predicted_start_s


@dataclass(frozen=True)
class GanttBar:
    """One bar of a Gantt chart: what ran (or was predicted to) on which lane, when.

    ``kind`` is ``compute``, ``copy`` (the executor moving a value) or ``transfer`` (the
    simulation's); ``units`` the units a compute bar runs.
    """

    lane: str
    device: int
    name: str
    kind: str
    start_s: float
    end_s: float
    backend: str | None
    units: tuple[int, ...]


@dataclass(frozen=True)
class DecisionOption:
    """One option the final choice weighed (:mod:`tvm_pesto.choose`): its core shape,
    predicted and measured seconds, and why it was not timed or failed (``note``)."""

    name: str
    cluster: str
    predicted_s: float
    measured_s: float | None
    kept: bool
    note: str
    backend_mix: dict[str, int]


@dataclass(frozen=True)
class Report:
    """Everything the report page shows (:func:`build_report`)."""

    model: str
    cluster: str
    devices: tuple[str, ...]
    backends: tuple[str, ...]
    cost_source: str
    predicted_run_s: float
    measured_run_s: float | None
    units: tuple[UnitRecord, ...]
    nodes: tuple[NodeRecord, ...]
    unit_edges: tuple[tuple[int, int], ...]
    node_edges: tuple[tuple[int, int], ...]
    predicted: tuple[GanttBar, ...]
    measured: tuple[GanttBar, ...]
    decision: tuple[DecisionOption, ...]
    decision_note: str

    def to_dict(self) -> dict:
        """The report as JSON-ready data (``report.json``; schema ``report``)."""
        return asdict(self)


def build_report(placed, trace=None, measured_s: float | None = None, model: str | None = None) -> Report:
    """The :class:`Report` of a built model and one traced run of it.

    Parameters
    ----------
    placed : PlacedModule
        Built by :func:`tvm_pesto.build` (it holds the placement, the candidates and costs,
        and the final choice's ``decision``).
    trace : list of TraceEvent, optional
        One traced run (:meth:`~tvm_pesto.run.runtime.PlacedRuntime.run_traced`); without
        it the measured times are None and the measured chart is empty.
    measured_s : float, optional
        The model's measured time per run (e.g. the median of many); default: the kept
        option's measured time in the final choice, if it was timed.
    model : str, optional
        The model's name for the page's title (default: the op graph's name).

    Raises
    ------
    ReportError
        When ``placed`` holds no placement (built from a given plan), or its segments do
        not match the units of its plan.
    """
    if getattr(placed, "placement", None) is None:
        raise ReportError("this model holds no placement (it was built from a given plan): a report needs the "
                          "candidates and costs it was placed with; build it with tvm_pesto.build(mod, cluster)")
    return placement_report(placed.placement, placed.cluster, placed.unit_segments(), trace, measured_s,
                            getattr(placed, "decision", None), model)


def placement_report(pl, cluster, segments: dict, trace=None, measured_s: float | None = None,
                     decision=None, model: str | None = None) -> Report:
    """The :class:`Report` of a placement (:class:`~tvm_pesto.plan.placement.Placement`) on
    ``cluster``, whose units run in ``segments`` (segment name -> units:
    :func:`tvm_pesto.builder.rewrite.unit_segments`); ``trace``, ``measured_s`` and the final
    choice's ``decision`` where it was built and run (see :func:`build_report`)."""
    plan, problem, sim = pl.plan, pl.problem, pl.sim
    unit_seg = {u: name for name, us in segments.items() for u in us}
    if len(unit_seg) != len(plan.units):
        raise ReportError(f"the model's segments hold {len(unit_seg)} units but its plan has {len(plan.units)}; "
                          "report on the module tvm_pesto.build returned")
    seg_time = _segment_times(trace)
    units = _units(plan, problem, sim, segments, unit_seg, seg_time)
    nodes = _nodes(pl, units, seg_time)
    options, note, kept_s = _decision(decision)
    backends = sorted({c.backend for c in pl.candidates} | {u.backend for u in plan.units})
    devices = tuple(d.name for d in cluster.devices)
    # sim_events lists the units' compute rows first, in unit order
    predicted = tuple(_bar(r, devices, plan, (k,) if r["kind"] == "compute" else ())
                      for k, r in enumerate(sim_events(problem, plan, sim)))
    measured = tuple(_bar(r, devices, plan, segments.get(r["name"], ()) if r["kind"] == "compute" else ())
                     for r in trace_events(trace or []))
    return Report(model=model or pl.analysis.op_graph.name, cluster=cluster.name, devices=devices,
                  backends=tuple(backends), cost_source=str(pl.costs.source), predicted_run_s=float(sim.run_s),
                  measured_run_s=measured_s if measured_s is not None else kept_s, units=units, nodes=nodes,
                  unit_edges=tuple((int(u), int(v)) for u, v, _ in problem.graph.edges()),
                  node_edges=tuple((int(u), int(v)) for u, v, _ in pl.analysis.op_graph.edges()),
                  predicted=predicted, measured=measured, decision=options, decision_note=note)


def _segment_times(trace) -> dict[str, tuple[float, float]]:
    """Segment name -> (start, end) of its compute event in ``trace`` (the first, if several)."""
    out: dict[str, tuple[float, float]] = {}
    for ev in trace or []:
        if ev.kind == "compute" and ev.name not in out:
            out[ev.name] = (float(ev.start), float(ev.end))
    return out


def _units(plan, problem, sim, seg_units, unit_seg, seg_time) -> tuple[UnitRecord, ...]:
    pred = {u: float(sim.finish[u] - sim.start[u]) for u in range(len(plan.units))}
    out = []
    for u, cand in enumerate(plan.units):
        seg = unit_seg.get(u)
        span = seg_time.get(seg)
        seg_s = span[1] - span[0] if span is not None else None
        mates = seg_units.get(seg, (u,))
        together = sum(pred[m] for m in mates)
        share = pred[u] / together if together > 0 else 1 / len(mates)
        out.append(UnitRecord(
            id=u, name=problem.graph.nodes[u].name, backend=cand.backend, pattern=cand.pattern,
            device=int(plan.assignment[u]), nodes=tuple(int(v) for v in cand.nodes),
            predicted_start_s=float(sim.start[u]), predicted_end_s=float(sim.finish[u]), segment=seg,
            segment_measured_s=seg_s, measured_s=seg_s * share if seg_s is not None else None,
            measured_split=len(mates) > 1))
    return tuple(out)


def backend_costs(candidates, table: np.ndarray, node_device: dict[int, int]) -> dict[int, dict[str, tuple]]:
    """Node -> backend -> ``(seconds, ops)`` of that backend's smallest candidate holding the
    node (the cheaper of equal size) on the node's device; backends without a finite one are
    left out.

    Examples
    --------
    >>> from tvm_pesto.candidates.generate import Candidate
    >>> cands = [Candidate("tvm", (0,)), Candidate("tvm", (0, 1)), Candidate("ort", (0, 1))]
    >>> table = np.array([[1.0, 2.0], [1.5, 1.0], [0.5, np.inf]])
    >>> backend_costs(cands, table, {0: 0, 1: 1})
    {0: {'tvm': (1.0, 1), 'ort': (0.5, 2)}, 1: {'tvm': (1.0, 2)}}
    """
    best: dict[int, dict[str, tuple]] = defaultdict(dict)
    for ci, c in enumerate(candidates):
        for v in c.nodes:
            d = node_device.get(int(v))
            if d is None or not np.isfinite(table[ci, d]):
                continue
            key = (len(c.nodes), float(table[ci, d]))
            have = best[int(v)].get(c.backend)
            if have is None or key < (have[1], have[0]):
                best[int(v)][c.backend] = (key[1], key[0])
    return {v: best[v] for v in sorted(best)}


def _nodes(pl, units, seg_time) -> tuple[NodeRecord, ...]:
    og = pl.analysis.op_graph
    unit_of = {v: u for u in units for v in u.nodes}
    if len(unit_of) != og.num_nodes:
        raise ReportError(f"the plan's units hold {len(unit_of)} of the model's {og.num_nodes} ops; report on the "
                          "module tvm_pesto.build returned")
    priced = backend_costs(list(pl.candidates), np.asarray(pl.costs.table), {v: u.device for v, u in unit_of.items()})
    backends = sorted({c.backend for c in pl.candidates})
    out = []
    for row in pl.node_table():
        u = unit_of[row.node]
        span = seg_time.get(u.segment) if u.segment else None
        have = priced.get(row.node, {})
        out.append(NodeRecord(
            id=row.node, name=row.name, op=row.op, unit=row.unit, backend=row.backend, device=u.device,
            start_s=u.predicted_start_s, end_s=u.predicted_end_s,
            measured_start_s=span[0] if span else None, measured_end_s=span[1] if span else None,
            costs={b: have[b][0] if b in have else None for b in backends},
            cost_ops={b: have[b][1] for b in backends if b in have}, pinned=row.pinned))
    return tuple(out)


def _decision(decision) -> tuple[tuple[DecisionOption, ...], str, float | None]:
    """The final choice's options (a :class:`tvm_pesto.choose.decision.Decision`), a one-line
    note on it, and the kept option's measured seconds."""
    if not decision:
        return (), "no final choice: the plan was not built and timed against other options", None
    chosen = decision.chosen
    opts = []
    for o in decision.options:
        note = f"failed: {o.error}" if o.error is not None else (o.skipped or o.timed_once or "")
        opts.append(DecisionOption(name=o.name, cluster=o.cluster, predicted_s=float(o.predicted_s),
                                   measured_s=None if o.measured_s is None else float(o.measured_s),
                                   kept=o.name == chosen, note=str(note),
                                   backend_mix={k: int(n) for k, n in (o.backend_mix or {}).items()}))
    kept = next((o.measured_s for o in opts if o.kept), None)
    note = (f"options timed against each other; kept: {chosen}" if decision.measured
            else f"not measured: {decision.why}; kept: {chosen}")
    if decision.claim is not None:
        note += f"; claim: {decision.claim.status} (decided by {decision.claim.decided_by})"
    return tuple(opts), note, kept


def _bar(row: dict, devices, plan, units) -> GanttBar:
    """A Gantt bar of a simulated (:func:`~tvm_pesto.plan.trace.sim_events`) or traced row
    that runs ``units``."""
    if row["kind"] == "transfer":
        lane = f"link {row['link']}"
    else:
        lane = devices[row["device"]] if row["device"] < len(devices) else f"dev{row['device']}"
    backends = {plan.units[u].backend for u in units}
    return GanttBar(lane=lane, device=int(row["device"]), name=str(row["name"]), kind=str(row["kind"]),
                    start_s=float(row["start"]), end_s=float(row["end"]),
                    backend=backends.pop() if len(backends) == 1 else None, units=tuple(int(u) for u in units))


__all__ = ["DecisionOption", "GanttBar", "NodeRecord", "Report", "ReportError", "UnitRecord", "backend_costs",
           "build_report", "placement_report"]
