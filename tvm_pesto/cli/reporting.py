"""``tvm-pesto place MODEL --report DIR``: the report of the best plan, predicted only
(:func:`tvm_pesto.report.placement_report`; ``run --report`` reports what it built and ran,
:meth:`tvm_pesto.builder.placed.PlacedModule.report`)."""
from __future__ import annotations

import os

from ..builder.rewrite import unit_segments
from ..report import placement_report, write_report


def with_report(out: dict, target: str, placements: dict, cluster, report_dir: str | None) -> dict:
    """``place``'s JSON ``out``, with the files of its best plan's report in ``out["report"]``
    when ``report_dir`` is given (``placements``: solver -> its Placement, for a model)."""
    if report_dir:
        pl = placements[out["best"]]
        rep = placement_report(pl, cluster, unit_segments(pl.analysis.rg, pl.plan), model=os.path.basename(target))
        out["report"] = write_report(rep, report_dir)
    return out


__all__ = ["with_report"]
