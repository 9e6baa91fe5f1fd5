"""Where every node of a placed model ran and why: ``placed.report(dir)`` and ``tvm-pesto run
--report DIR`` write ``report.html`` (one self-contained page), ``report.json`` and ``nodes.csv``.

:mod:`~tvm_pesto.report.records` builds the typed records of a built model and one traced run
(:func:`build_report`; :func:`placement_report` of a placement not built, for ``tvm-pesto place
--report``), :mod:`~tvm_pesto.report.page` renders the page (the graph laid out by
dagre, vendored in ``assets/``), :mod:`~tvm_pesto.report.write` writes the three files.
"""
from __future__ import annotations

from .records import (DecisionOption, GanttBar, NodeRecord, Report, ReportError, UnitRecord, build_report,
                      placement_report)
from .write import write_report

__all__ = ["DecisionOption", "GanttBar", "NodeRecord", "Report", "ReportError", "UnitRecord", "build_report",
           "placement_report", "write_report"]
