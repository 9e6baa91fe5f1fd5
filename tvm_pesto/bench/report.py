"""Shared helpers of the benchmarks: machine facts, atomic output files, markdown tables."""
from __future__ import annotations

import datetime
import math
import os
import platform
import statistics
import tempfile

from ..cluster.host import cpu_identity
from ..costs.measure.blocks import best_two_spread

#: A benchmark's time stands when a second block reproduces its best within this fraction.
AGREE = 0.03


def machine_info() -> dict:
    """Facts about this machine that a benchmark table should carry.

    Returns
    -------
    dict
        ``nproc`` (CPUs this process may use), ``cpu_model``, ``cpu_id`` and ``cpu_isa``
        (the brand string, ``vendor/family/model/stepping`` and vector extensions:
        :func:`~tvm_pesto.cluster.host.cpu_identity`), ``load_average`` (1, 5, 15 minutes,
        or None), ``python``, ``platform``, ``date`` (UTC, to the minute).

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
            "load_average": load, "python": platform.python_version(), "platform": platform.platform(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


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


def timing_noise(blocks: dict, same=(), agree: float = AGREE) -> dict:
    """How far one run's timings can be trusted, from its own blocks.

    Parameters
    ----------
    blocks : dict
        variant -> its block medians (``time_blocks(...)[name]["blocks_s"]``).
    same : iterable of (str, str)
        Pairs of variants that run the same program (the same cover of the same device):
        their difference is the run's noise, whatever the blocks say.
    agree : float
        A variant is ``unconfirmed`` when its two best blocks differ by more than this.

    Returns
    -------
    dict
        ``spread_median`` and ``spread_max`` (second-best block over the best, minus 1, over
        the variants with two blocks), ``spread_max_variant``, ``unconfirmed`` (variant names),
        ``same_program`` (``"a = b"`` -> the slower one over the faster, minus 1),
        ``same_program_max`` and ``count`` (variants). A ratio of two variants closer to 1
        than these is not resolved by the run.

    Examples
    --------
    >>> from tvm_pesto.bench.report import timing_noise
    >>> n = timing_noise({"a": [1.0, 1.01], "b": [2.0, 2.6, 2.5], "c": [2.2, 2.21]}, same=[("b", "c")])
    >>> n["spread_max_variant"], n["unconfirmed"], round(n["same_program_max"], 2)
    ('b', ['b'], 0.1)
    """
    spreads = {k: best_two_spread(v) for k, v in blocks.items()}
    have = {k: s for k, s in spreads.items() if s is not None}
    worst = max(have, key=have.get) if have else None
    same_program = {}
    for a, b in same:
        if blocks.get(a) and blocks.get(b):
            ta, tb = min(blocks[a]), min(blocks[b])
            same_program[f"{a} = {b}"] = max(ta, tb) / min(ta, tb) - 1.0
    return {"count": len(blocks), "spread_median": statistics.median(have.values()) if have else None,
            "spread_max": have[worst] if worst else None, "spread_max_variant": worst,
            "unconfirmed": [k for k, s in spreads.items() if s is None or s > agree],
            "same_program": same_program, "same_program_max": max(same_program.values(), default=None)}


def noise_line(noise: dict, agree: float = AGREE) -> str:
    """One sentence of :func:`timing_noise` for a benchmark's printout.

    Examples
    --------
    >>> print(noise_line(timing_noise({"a": [1.0, 1.01], "b": [2.0, 2.6]}, same=[("a", "b")])))
    ... # doctest: +NORMALIZE_WHITESPACE
    timing noise: a variant's two best blocks differed by median 15.5 %, up to 30.0 % (b);
    1 of 2 variants not reproduced within 3 %; the same program timed as two variants differed
    by up to 100.0 %: ratios closer to 1 than that are not resolved by this run
    """
    pct = lambda x: f"{100 * x:.1f} %"  # noqa: E731
    if noise.get("spread_median") is None:
        return "timing noise: not known (one block per variant)"
    parts = [f"timing noise: a variant's two best blocks differed by median {pct(noise['spread_median'])}, "
             f"up to {pct(noise['spread_max'])} ({noise['spread_max_variant']})"]
    parts.append(f"{len(noise['unconfirmed'])} of {noise['count']} variants not reproduced within {100 * agree:.0f} %")
    if noise.get("same_program_max") is not None:
        parts.append(f"the same program timed as two variants differed by up to {pct(noise['same_program_max'])}: "
                     "ratios closer to 1 than that are not resolved by this run")
    return "; ".join(parts)


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
