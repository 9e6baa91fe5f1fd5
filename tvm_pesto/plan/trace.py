"""Export a simulated (or measured) schedule: Chrome trace JSON and a Gantt chart PNG."""
from __future__ import annotations

import json
import os

import numpy as np


def sim_events(problem, plan, sim) -> list[dict]:
    """Rows ``{device, name, kind, start, end}`` (seconds) from a simulation."""
    rows = []
    for v in range(problem.num_nodes):
        rows.append({"device": int(plan.assignment[v]), "name": problem.graph.nodes[v].name,
                     "kind": "compute", "start": float(sim.start[v]), "end": float(sim.finish[v])})
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


def gantt_png(rows: list[dict], path: str, title: str = "", device_names=None, compare=None) -> None:
    """Draw a Gantt chart: one lane per device (and per link for transfers).

    ``compare`` (optional rows) draws a second chart below, e.g. measured vs simulated.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(title or "plan", rows)] + ([("measured", compare)] if compare is not None else [])
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, 2.2 + 1.1 * len(panels) * 2), squeeze=False)
    cmap = plt.get_cmap("tab20")
    for ax, (name, rs) in zip(axes[:, 0], panels):
        lanes = sorted({(r["kind"] == "transfer", r.get("link", ""), r["device"]) for r in rs})
        lane_idx = {ln: k for k, ln in enumerate(lanes)}
        for k, r in enumerate(rs):
            ln = (r["kind"] == "transfer", r.get("link", ""), r["device"])
            y = lane_idx[ln]
            color = "0.6" if r["kind"] in ("transfer", "copy") else cmap(k % 20)
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
        end = max((r["end"] for r in rs), default=0.0)
        ax.set_title(f"{name}: {end * 1e3:.2f} ms")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_trace_dir(out_dir: str, problem, plan, sim, trace, device_names, title: str,
                    run_file: str = "run_trace.json") -> list[str]:
    """Write a placement's simulated schedule (``plan_trace.json``), what really ran
    (``run_file``, from the executor's ``trace``) and both as one Gantt chart
    (``gantt.png``) into ``out_dir``; returns the folder's file names.

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
    gantt_png(rows, os.path.join(out_dir, "gantt.png"), title=title, device_names=device_names, compare=ran)
    return sorted(os.listdir(out_dir))
