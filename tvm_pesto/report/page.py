"""The report page: one self-contained HTML file (its scripts and styles inline, no network).

The tables (the final choice's options, the units, the nodes) are HTML the page holds; the
graph and the Gantt charts are drawn by the page's script (``assets/report.js``) from the
report's data, embedded as JSON (``<script type="application/json" id="report-data">``, the
same data as ``report.json``). The graph is laid out by dagre (``assets/dagre.min.js``, the
npm package ``@dagrejs/dagre`` 3.1.4, MIT licence: ``assets/dagre.LICENSE.txt``): one box per
unit (a fusion group or a library's region: collapsed; a click shows its ops), filled with
its backend's colour and outlined in its device's.
"""
from __future__ import annotations

import html
import json
from pathlib import Path

from ..jsonio import jsonable
from .records import Report

ASSETS = Path(__file__).parent / "assets"

#: Fill colours of the backends, in the order of the report's backends (then repeated).
BACKEND_COLOURS = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#b07aa1", "#76b7b2", "#edc948", "#ff9da7",
                   "#9c755f", "#bab0ac")
#: Outline colours and dash patterns of the devices, by device index (then repeated).
DEVICE_COLOURS = ("#1b1b1b", "#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf")
DEVICE_DASHES = ("", "6 3", "2 2", "8 3 2 3")


def page_style(report: Report) -> dict:
    """The colours the page draws with: ``backends`` (name -> fill) and ``devices`` (per
    device: outline colour and dash pattern).

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> page_style(SimpleNamespace(backends=("onnxruntime", "tvm"), devices=("cpu0", "cpu1")))["backends"]
    {'onnxruntime': '#4e79a7', 'tvm': '#f28e2b'}
    """
    return {"backends": {b: BACKEND_COLOURS[k % len(BACKEND_COLOURS)] for k, b in enumerate(report.backends)},
            "devices": [{"name": d, "colour": DEVICE_COLOURS[k % len(DEVICE_COLOURS)],
                         "dash": DEVICE_DASHES[(k // len(DEVICE_COLOURS)) % len(DEVICE_DASHES)] if k else ""}
                        for k, d in enumerate(report.devices)]}


def _ms(s: float | None) -> str:
    return "—" if s is None else f"{s * 1e3:.4g}"


def _json_script(ident: str, data) -> str:
    text = json.dumps(data, allow_nan=False).replace("</", "<\\/")
    return f'<script type="application/json" id="{ident}">{text}</script>'


def _swatch(colour: str) -> str:
    return f'<span class="swatch" style="background:{colour}"></span>'


def _legend(report: Report, style: dict) -> str:
    backs = "".join(f"<li>{_swatch(c)}{html.escape(b)}</li>" for b, c in style["backends"].items())
    devs = "".join(f'<li><span class="swatch dev" style="border-color:{d["colour"]};border-style:'
                   f'{"dashed" if d["dash"] else "solid"}"></span>{html.escape(d["name"])}</li>'
                   for d in style["devices"])
    return f'<ul class="legend"><li><b>backends</b></li>{backs}<li><b>devices</b></li>{devs}</ul>'


def _decision_table(report: Report) -> str:
    rows = []
    for o in report.decision:
        mix = ", ".join(f"{html.escape(b)} {n}" for b, n in sorted(o.backend_mix.items()))
        rows.append(f'<tr class="{"kept" if o.kept else ""}"><td>{html.escape(o.name)}{" (kept)" if o.kept else ""}'
                    f"</td><td>{html.escape(o.cluster)}</td><td>{_ms(o.predicted_s)}</td><td>{_ms(o.measured_s)}</td>"
                    f"<td>{mix}</td><td>{html.escape(o.note)}</td></tr>")
    return ('<table id="decision-table"><thead><tr><th>option</th><th>shape</th><th>predicted ms</th>'
            "<th>measured ms</th><th>backends (ops)</th><th>note</th></tr></thead><tbody>"
            + "".join(rows) + "</tbody></table>")


def _unit_table(report: Report, style: dict) -> str:
    rows = []
    names = {n.id: n.name for n in report.nodes}
    for u in report.units:
        ops = ", ".join(html.escape(names[v]) for v in u.nodes)
        colour = style["backends"].get(u.backend, "#ccc")
        rows.append(f'<tr data-unit="{u.id}"><td>{u.id}</td><td>{_swatch(colour)}{html.escape(u.backend)}</td>'
                    f"<td>{html.escape(report.devices[u.device])}</td><td>{_ms(u.predicted_s)}</td>"
                    f"<td>{_ms(u.measured_s)}{' *' if u.measured_split else ''}</td>"
                    f"<td>{html.escape(u.segment or '—')}</td><td><details><summary>{len(u.nodes)} ops</summary>"
                    f"{ops}</details></td></tr>")
    return ('<table id="unit-table"><thead><tr><th>unit</th><th>backend</th><th>device</th><th>predicted ms</th>'
            "<th>measured ms</th><th>segment</th><th>ops</th></tr></thead><tbody>" + "".join(rows)
            + "</tbody></table>")


def _node_table(report: Report, style: dict) -> str:
    head = "".join(f"<th>{html.escape(b)} ms</th>" for b in report.backends)
    rows = []
    for n in report.nodes:
        cells = []
        for b in report.backends:
            c = n.costs.get(b)
            ops = n.cost_ops.get(b, 1)
            cells.append(f'<td class="{"chosen" if b == n.backend else ""}">{_ms(c)}'
                         f'{f" ({ops} ops)" if c is not None and ops > 1 else ""}</td>')
        rows.append(f'<tr data-node="{n.id}"><td>{n.id}</td><td>{html.escape(n.name)}</td><td>{html.escape(n.op)}</td>'
                    f'<td>{n.unit}</td><td>{_swatch(style["backends"].get(n.backend, "#ccc"))}{html.escape(n.backend)}'
                    f"</td><td>{html.escape(report.devices[n.device])}</td><td>{_ms(n.start_s)}</td>"
                    f"<td>{_ms(n.end_s)}</td>{''.join(cells)}</tr>")
    return ('<table id="node-table"><thead><tr><th>node</th><th>name</th><th>op</th><th>unit</th><th>backend</th>'
            f"<th>device</th><th>start ms</th><th>end ms</th>{head}</tr></thead><tbody>" + "".join(rows)
            + "</tbody></table>")


def render_html(report: Report) -> str:
    """The report page of ``report`` as one HTML document."""
    style = page_style(report)
    title = f"{report.model} on {report.cluster}"
    summary = (f"predicted {_ms(report.predicted_run_s)} ms a run, measured {_ms(report.measured_run_s)} ms; "
               f"{len(report.units)} units, {len(report.nodes)} ops; costs: {report.cost_source}")
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>tvm-pesto report: {html.escape(title)}</title>",
        f"<style>{(ASSETS / 'report.css').read_text()}</style></head><body>",
        f"<h1>{html.escape(title)}</h1><p id=\"summary\">{html.escape(summary)}</p>", _legend(report, style),
        '<h2>Graph</h2><p class="hint">One box per unit, filled by backend, outlined by device; click a unit to show '
        'or hide its ops; hover for what each backend would have cost.</p>'
        '<p><button id="expand-all">expand all</button> <button id="collapse-all">collapse all</button></p>'
        '<div id="graph"></div><div id="tooltip" hidden></div>',
        '<h2>Gantt: simulated</h2><div id="gantt-predicted" class="gantt"></div>',
        '<h2>Gantt: measured (one traced run)</h2><div id="gantt-measured" class="gantt"></div>',
        f"<h2>Final choice</h2><p>{html.escape(report.decision_note)}</p>{_decision_table(report)}",
        "<h2>Units</h2><p class=\"hint\">measured: the unit's compiled segment in the traced run; * a segment of "
        "several units, split in proportion to their predicted times.</p>" + _unit_table(report, style),
        "<h2>Nodes</h2><p class=\"hint\">per backend: the predicted time of its smallest candidate holding the node, "
        "on the node's device (a candidate of several ops is priced whole).</p>"
        '<p><input id="search" type="search" placeholder="filter nodes: name, op, backend, device"> '
        '<span id="search-count"></span></p>' + _node_table(report, style),
        _json_script("report-data", jsonable(report.to_dict())), _json_script("report-style", style),
        f"<script>{(ASSETS / 'dagre.min.js').read_text()}</script>",
        f"<script>{(ASSETS / 'report.js').read_text()}</script>", "</body></html>", ""])


__all__ = ["BACKEND_COLOURS", "DEVICE_COLOURS", "page_style", "render_html"]
