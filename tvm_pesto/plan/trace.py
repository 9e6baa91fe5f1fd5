"""Export a simulated (or measured) schedule: Chrome trace JSON and a Gantt chart PNG."""
from __future__ import annotations

import json
import os

import numpy as np


def sim_events(problem, plan, sim) -> list[dict]:
    """Rows ``{device, name, kind, start, end}`` (seconds) from a simulation; compute rows
    also name their unit's ``backend`` when the plan chose backends (``plan.units``)."""
    rows = []
    units = plan.units if plan.units is not None and len(plan.units) == problem.num_nodes else None
    for v in range(problem.num_nodes):
        rows.append({"device": int(plan.assignment[v]), "name": problem.graph.nodes[v].name,
                     "kind": "compute", "start": float(sim.start[v]), "end": float(sim.finish[v]),
                     **({"backend": units[v].backend} if units is not None else {})})
    for prod, sd, dd, s, e, b in sim.transfers:
        rows.append({"device": int(sd), "name": f"{problem.graph.nodes[int(prod)].name} -> dev{int(dd)}",
                     "kind": "transfer", "start": float(s), "end": float(e), "link": f"{int(sd)}->{int(dd)}",
                     "bytes": float(b)})
    return rows


def trace_events(trace) -> list[dict]:
    """Rows from an executor trace (list of :class:`tvm_pesto.run.TraceEvent`)."""
    return [{"device": t.device, "name": t.name, "kind": t.kind, "start": t.start, "end": t.end} for t in trace]


def chrome_trace(rows: list[dict], path: str, device_names=None) -> None:
    """Write rows as a Chrome trace (open in chrome://tracing or ui.perfetto.dev)."""
    events = []
    for r in rows:
        tid = f"link {r['link']}" if r["kind"] == "transfer" else (
            device_names[r["device"]] if device_names else f"dev{r['device']}")
        events.append({"name": r["name"], "cat": r["kind"], "ph": "X", "pid": 0, "tid": tid,
                       "ts": r["start"] * 1e6, "dur": max(r["end"] - r["start"], 0.0) * 1e6,
                       "args": {k: v for k, v in r.items() if k in ("bytes", "link")}})
    with open(path, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)


def gantt_png(rows: list[dict], path: str, title: str = "", device_names=None, compare=None,
              measured_s: float | None = None) -> None:
    """Draw a Gantt chart: one lane per device (and per link for transfers); rows that name
    a ``backend`` are coloured by it, with a legend.

    ``compare`` (optional rows) draws a second chart below, e.g. one traced run under the
    simulated plan; ``measured_s`` (the median of many runs) goes into its title beside the
    traced run's length, which a single run (and the tracing itself) makes longer.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    panels = [(title or "plan", rows)] + ([("measured", compare)] if compare is not None else [])
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, 2.2 + 1.1 * len(panels) * 2), squeeze=False)
    cmap = plt.get_cmap("tab20")
    backends = sorted({r["backend"] for p in panels for r in p[1] if r.get("backend")})
    by_backend = {b: plt.get_cmap("tab10")(k % 10) for k, b in enumerate(backends)}
    for ax, (name, rs) in zip(axes[:, 0], panels):
        lanes = sorted({(r["kind"] == "transfer", r.get("link", ""), r["device"]) for r in rs})
        lane_idx = {ln: k for k, ln in enumerate(lanes)}
        for k, r in enumerate(rs):
            ln = (r["kind"] == "transfer", r.get("link", ""), r["device"])
            y = lane_idx[ln]
            color = ("0.6" if r["kind"] in ("transfer", "copy")
                     else by_backend[r["backend"]] if r.get("backend") else cmap(k % 20))
            ax.barh(y, (r["end"] - r["start"]) * 1e3, left=r["start"] * 1e3, height=0.7, color=color,
                    edgecolor="black", linewidth=0.3)
        labels = []
        for is_tx, link, dev in lanes:
            if is_tx:
                labels.append(f"link {link}")
            else:
                labels.append(device_names[dev] if device_names else f"dev{dev}")
        ax.set_yticks(np.arange(len(lanes)))
        ax.set_yticklabels(labels)
        ax.invert_yaxis()
        ax.set_xlabel("time (ms)")
        ax.set_xlim(left=0)
        ax.set_title(panel_title(name, rs, measured_s if name == "measured" else None))
        shown = sorted({r["backend"] for r in rs if r.get("backend")})
        if shown:
            ax.legend(handles=[Patch(color=by_backend[b], label=b) for b in shown], loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def panel_title(name: str, rows: list[dict], measured_s: float | None = None) -> str:
    """A Gantt panel's title: its name and length; with ``measured_s``, a traced run's
    length beside the median of the timed runs.

    Examples
    --------
    >>> panel_title("plan", [{"end": 7e-4}])
    'plan: 0.70 ms'
    >>> panel_title("measured", [{"end": 1.16e-3}], measured_s=6.93e-4)
    'one traced run: 1.16 ms (median of the timed runs: 0.693 ms)'
    """
    end = max((r["end"] for r in rows), default=0.0)
    if measured_s is not None:
        return f"one traced run: {end * 1e3:.2f} ms (median of the timed runs: {measured_s * 1e3:.3f} ms)"
    return f"{name}: {end * 1e3:.2f} ms"


def write_trace_dir(out_dir: str, problem, plan, sim, trace, device_names, title: str,
                    run_file: str = "run_trace.json", measured_s: float | None = None) -> list[str]:
    """Write a placement's simulated schedule (``plan_trace.json``), what really ran
    (``run_file``, from the executor's ``trace``) and both as one Gantt chart
    (``gantt.png``, units coloured by backend; ``measured_s``: the median run, in the
    measured panel's title) into ``out_dir``; returns the folder's file names.

    Examples
    --------
    >>> import tvm_pesto
    >>> from tvm_pesto.candidates.examples import tiny_cnn
    >>> mod, (x,) = tiny_cnn()
    >>> placed = tvm_pesto.build(mod, "cpu:2", costs="roofline")
    >>> out, trace = placed.run_traced(x)
    >>> pl = placed.placement
    >>> import os, tempfile
    >>> out_dir = os.path.join(tempfile.mkdtemp(), "trace")
    >>> write_trace_dir(out_dir, pl.problem, pl.plan, pl.sim, trace, ["cpu0", "cpu1"], "tiny_cnn")
    ['gantt.png', 'plan_trace.json', 'run_trace.json']
    """
    os.makedirs(out_dir, exist_ok=True)
    rows, ran = sim_events(problem, plan, sim), trace_events(trace)
    chrome_trace(rows, os.path.join(out_dir, "plan_trace.json"), device_names)
    chrome_trace(ran, os.path.join(out_dir, run_file), device_names)
    gantt_png(rows, os.path.join(out_dir, "gantt.png"), title=title, device_names=device_names, compare=ran,
              measured_s=measured_s)
    return sorted(os.listdir(out_dir))
