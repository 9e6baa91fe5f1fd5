"""Write a :class:`~tvm_pesto.report.records.Report`: ``report.html`` (the page,
:mod:`tvm_pesto.report.page`), ``report.json`` (schema ``report``) and ``nodes.csv``."""
from __future__ import annotations

import csv
import os

from ..jsonio import write_json
from .page import render_html
from .records import Report

#: The CSV's columns before one ``cost_<backend>_s`` column per backend.
CSV_COLUMNS = ("node", "name", "op", "unit", "backend", "device", "start_s", "end_s", "measured_start_s",
               "measured_end_s")


def csv_rows(report: Report) -> list[list]:
    """The rows of ``nodes.csv``, its header first: node -> backend, device, simulated start and end,
    measured start and end (its unit's segment), each backend's predicted seconds (empty:
    no candidate of that backend holds the node on its device) and the pin that put it there.

    Examples
    --------
    >>> from tvm_pesto.report.records import NodeRecord
    >>> from types import SimpleNamespace
    >>> n = NodeRecord(0, "lv:conv2d", "relax.nn.conv2d", 0, "tvm", 1, 0.0, 2e-3, None, None,
    ...                {"onnxruntime": None, "tvm": 2e-3}, {"tvm": 1})
    >>> csv_rows(SimpleNamespace(backends=("onnxruntime", "tvm"), devices=("cpu0", "cpu1"), nodes=(n,)))[1]
    [0, 'lv:conv2d', 'relax.nn.conv2d', 0, 'tvm', 'cpu1', 0.0, 0.002, '', '', '', 0.002, '']
    """
    head = [*CSV_COLUMNS, *(f"cost_{b}_s" for b in report.backends), "pinned"]
    rows: list[list] = [head]
    for n in report.nodes:
        rows.append([n.id, n.name, n.op, n.unit, n.backend, report.devices[n.device], n.start_s, n.end_s,
                     "" if n.measured_start_s is None else n.measured_start_s,
                     "" if n.measured_end_s is None else n.measured_end_s,
                     *("" if n.costs.get(b) is None else n.costs[b] for b in report.backends), n.pinned or ""])
    return rows


def write_report(report: Report, path: str) -> list[str]:
    """Write ``report.html``, ``report.json`` and ``nodes.csv`` of ``report`` into the folder
    ``path`` (made if missing); returns the files' names."""
    os.makedirs(path, exist_ok=True)
    write_json(os.path.join(path, "report.json"), report.to_dict(), schema="report")
    with open(os.path.join(path, "nodes.csv"), "w", newline="") as f:
        csv.writer(f).writerows(csv_rows(report))
    with open(os.path.join(path, "report.html"), "w", encoding="utf-8") as f:
        f.write(render_html(report))
    return ["nodes.csv", "report.html", "report.json"]


__all__ = ["CSV_COLUMNS", "csv_rows", "write_report"]
