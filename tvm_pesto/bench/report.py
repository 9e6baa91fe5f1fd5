"""Shared helpers of the benchmarks: machine facts, atomic output files, markdown tables."""
from __future__ import annotations

import math
import os
import platform
import tempfile

from ..cluster.host import cpu_identity


def machine_info() -> dict:
    """Facts about this machine that a benchmark table should carry.

    Returns
    -------
    dict
        ``nproc`` (CPUs this process may use), ``cpu_model``, ``cpu_id`` and ``cpu_isa``
        (the brand string, ``vendor/family/model/stepping`` and vector extensions:
        :func:`~tvm_pesto.cluster.host.cpu_identity`), ``load_average`` (1, 5, 15 minutes,
        or None), ``python``, ``platform``.

    Examples
    --------
    >>> from tvm_pesto.bench.report import machine_info
    >>> machine_info()["nproc"] >= 1
    True
    """
    try:
        nproc = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        nproc = os.cpu_count() or 1
    ident = cpu_identity()
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        load = None
    return {"nproc": nproc, "cpu_model": ident["name"] or "unknown", "cpu_id": ident["id"], "cpu_isa": ident["isa"],
            "load_average": load, "python": platform.python_version(), "platform": platform.platform()}


def geomean(xs) -> float | None:
    """The geometric mean of the positive numbers in ``xs`` (None if there are none).

    Examples
    --------
    >>> from tvm_pesto.bench.report import geomean
    >>> round(geomean([2.0, 0.5, 1.0]), 6), geomean([])
    (1.0, None)
    """
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def markdown_table(headers: list[str], rows: list[list], align: str | None = None) -> str:
    """A GitHub markdown table; ``align`` is one character per column (``l``/``r``).

    Examples
    --------
    >>> print(markdown_table(["a", "b"], [[1, "x"]], align="rl"))
    | a | b |
    |--:|:--|
    | 1 | x |
    """
    align = align or "l" + "r" * (len(headers) - 1)
    sep = ["--:" if a == "r" else ":--" for a in align]
    lines = ["| " + " | ".join(map(str, headers)) + " |", "|" + "|".join(sep) + "|"]
    for row in rows:
        lines.append("| " + " | ".join("" if c is None else str(c) for c in row) + " |")
    return "\n".join(lines)


def fmt(x, spec: str = ".3f", missing: str = "–") -> str:
    """Format a number, or ``missing`` for None/non-finite.

    Examples
    --------
    >>> fmt(1.23456), fmt(None), fmt(float("inf"))
    ('1.235', '–', '–')
    """
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return missing
    return format(x, spec)


def pyplot():
    """matplotlib's pyplot on the non-interactive Agg backend.

    Examples
    --------
    >>> plt = pyplot()
    >>> plt.get_backend().lower()
    'agg'
    """
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: str) -> str:
    """Save a matplotlib figure as PNG through a temporary file and close it."""
    path = os.path.abspath(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-", suffix=".png")
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=110, bbox_inches="tight")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
        pyplot().close(fig)
    return path
