"""What a library call costs more when the rest of the model has run since its last call.

A candidate is measured by calling it over and over, and the cost model learns from such
measurements: from its second call on, its weights, its library's code and data structures
sit in the core's caches. In a placed model's run the rest of the model runs between two of
a unit's calls and takes them out. The extra seconds are a property of a device size of this
machine (its caches, its memory), fitted on first use beside the dispatch figures and kept
in the same record per device core count (:mod:`tvm_pesto.costs.calibrate.cold`), as a grid:
``extra_s[i][j]``, what a call of a unit of ``unit_bytes[j]`` bytes of weights took more
after ``flush_bytes[i]`` other bytes were read since its last call than in a loop
(:class:`ColdFigure`). :func:`set_cold` is the one writer of ``cluster.meta["cold"]`` and
:func:`cold_figures` its reader (per device; a device size without a fit gets
:data:`ASSUMED_COLD`, source ``assumed``); :func:`tvm_pesto.costs.in_run.weights_from_memory`
prices each library candidate with it.

Examples
--------
>>> from tvm_pesto.cluster import parse_cluster
>>> c = parse_cluster("cpu:2")
>>> [f.source for f in cold_figures(c)]
['assumed', 'assumed']
>>> grid = {"flush_bytes": [4e6, 64e6], "unit_bytes": [1e4, 8e6], "extra_s": [[5e-5, 6e-5], [1e-4, 6e-4]]}
>>> _ = set_cold(c, {1: grid}, "measured", "2026-01-01T00:00:00")
>>> [(f.extra_s[1][1], f.source) for f in cold_figures(c)]
[(0.0006, 'measured'), (0.0006, 'measured')]
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ClusterError
from .cluster import Cluster
from .dispatch import SOURCES

#: The grid a device size without a fit of its own gets (a cluster of another machine's
#: devices, or ``$TVM_PESTO_MACHINE_CALIBRATION=off`` before any fit): a fit of a one-core
#: device of a 2-vCPU Intel Xeon VM (family 6 model 167, 2 MiB of L2 per core), rounded (the
#: first of 2026-12-07; the one kept there later reads 1-7 us after 1 MiB, 46-51 after 4 MiB).
ASSUMED_COLD = {"flush_bytes": [1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20],
                "unit_bytes": [16 << 10, 2 << 20, 16 << 20],
                "extra_s": [[2e-6, 4e-5, 4e-5], [5e-5, 5e-5, 5e-5], [5e-5, 7e-5, 1.1e-4], [6e-5, 1.1e-4, 1.1e-4],
                            [2.5e-4, 3e-4, 8.4e-4]]}


@dataclass(frozen=True)
class ColdFigure:
    """A device's grid (see the module): ``flush_bytes`` (increasing), ``unit_bytes``
    (increasing), ``extra_s`` (``len(flush_bytes)`` rows of ``len(unit_bytes)`` seconds), the
    device's ``cores``, ``source`` (:data:`~tvm_pesto.cluster.dispatch.SOURCES`), ``fitted_at``
    (None when assumed) and ``why`` (for an assumed grid: why no fit applies)."""

    flush_bytes: tuple
    unit_bytes: tuple
    extra_s: tuple
    cores: int
    source: str
    fitted_at: str | None = None
    why: str | None = None

    def to_json(self) -> dict:
        return {"flush_bytes": list(self.flush_bytes), "unit_bytes": list(self.unit_bytes),
                "extra_s": [list(r) for r in self.extra_s], "cores": self.cores, "source": self.source,
                "fitted_at": self.fitted_at, **({"why": self.why} if self.why else {})}


def check_grid(grid: dict, where: str) -> dict:
    """``grid`` (``flush_bytes``, ``unit_bytes``, ``extra_s``) as floats, checked.

    Raises
    ------
    ClusterError
        When a key is missing, the sizes are not increasing and positive, the rows do not match
        them, or a figure is not a number of seconds >= 0.
    """
    try:
        flush = [float(x) for x in grid["flush_bytes"]]
        units = [float(x) for x in grid["unit_bytes"]]
        extra = [[float(x) for x in row] for row in grid["extra_s"]]
    except (KeyError, TypeError, ValueError) as e:
        raise ClusterError(f"{where} is not a grid of flush_bytes, unit_bytes and extra_s ({type(e).__name__}: {e}); "
                           "delete the kept fit (it is fitted again on first use)") from e
    ok = (len(flush) >= 1 and len(units) >= 2 and flush[0] > 0 and units[0] > 0
          and all(np.diff(flush) > 0) and all(np.diff(units) > 0)
          and len(extra) == len(flush) and all(len(r) == len(units) for r in extra)
          and all(x >= 0.0 for r in extra for x in r))
    if not ok:
        raise ClusterError(f"{where}: flush_bytes and unit_bytes must increase from above 0 and extra_s hold one row "
                           "of seconds >= 0 per flush size, one per unit size; delete the kept fit (it is fitted "
                           "again on first use)")
    return {"flush_bytes": flush, "unit_bytes": units, "extra_s": extra}


def set_cold(cluster: Cluster, per_cores: dict, source: str, fitted_at: str | None = None, **extra) -> dict:
    """Write the grids into ``cluster.meta["cold"]`` (the one writer): ``per_cores`` maps a
    device core count to its grid (:func:`check_grid`); ``extra`` is kept beside them.

    Raises
    ------
    ClusterError
        For an unknown source or a grid :func:`check_grid` refuses.
    """
    if source not in SOURCES:
        raise ClusterError(f"unknown source {source!r} of cold-call figures; use one of {', '.join(SOURCES)}")
    grids = {str(int(c)): check_grid(g, f"the cold-call grid of {c}-core devices") for c, g in per_cores.items()}
    cluster.meta["cold"] = {"per_cores": grids, "source": source, "fitted_at": fitted_at, **extra}
    return cluster.meta["cold"]


def assume_cold(cluster: Cluster, why: str) -> dict:
    """Give ``cluster`` no cold-call fit: every CPU device gets :data:`ASSUMED_COLD`, saying ``why``."""
    return set_cold(cluster, {}, "assumed", why=why)


def cold_figures(cluster: Cluster) -> list[ColdFigure | None]:
    """Per device of ``cluster``: the grid of its core count, or :data:`ASSUMED_COLD` (source
    ``assumed``); None for a device that is not a CPU (the grid is of CPU caches)."""
    m = cluster.meta.get("cold") or {}
    per = m.get("per_cores") or {}
    out = []
    for dev in cluster.devices:
        cores = int(dev.cores)
        if dev.kind != "cpu":
            out.append(None)
            continue
        if str(cores) in per and m.get("source", "measured") != "assumed":
            g, source, at, why = per[str(cores)], str(m.get("source", "measured")), m.get("fitted_at"), None
        else:
            g, source, at = ASSUMED_COLD, "assumed", None
            why = m.get("why") or (f"no fit for {cores}-core devices on this machine" if m
                                   else "no fit of these devices on this machine")
        out.append(ColdFigure(tuple(g["flush_bytes"]), tuple(g["unit_bytes"]), tuple(tuple(r) for r in g["extra_s"]),
                              cores, source, at, why))
    return out


__all__ = ["ASSUMED_COLD", "ColdFigure", "assume_cold", "check_grid", "cold_figures", "set_cold"]
