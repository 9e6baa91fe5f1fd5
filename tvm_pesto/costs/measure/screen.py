"""A second core count of the same CPU, screened: a sample of each library's regions measured,
the rest scaled from their measurements on the first.

The ``screened`` cost source (:func:`tvm_pesto.costs.candidate_costs`) measures like
``measured`` except for a library's regions that the measurement cache already holds on
another core count of this CPU (a *sibling* target: ``cpu:2``'s one-core devices before the
final choice's one two-core device). Of those, per backend, the whole model and one region in
:data:`SAMPLE_EVERY` (at least :data:`SAMPLE_MIN`, spread over the range of their sibling
times) are measured; each other region's seconds are its sibling's scaled by a fit of
``log(here / sibling)`` on ``log(sibling)`` over the backend's measured pairs (larger regions
gain more from more threads; one backend's small regions run slower on two threads than on
one). A region infeasible on the sibling is infeasible here. TVM's fusion groups are
screened the same way (their sample compiled into one module).

Measured on a 2-vCPU Xeon (the corpus's ResNet-18 at size small, every region timed on both core counts):
fitted on one region in four, the other regions' scaled seconds were within 0.76-1.32x
of their measurements (10th to 90th percentile) for ONNX Runtime and OpenVINO, their sum
0.92-0.96x; the whole model's ratio alone would have put them 0.33-0.83x.

Examples
--------
>>> import numpy as np
>>> sib = np.array([1e-5, 4e-5, 1e-4, 1e-3])
>>> fit = RatioFit.fit(sib, sib * np.array([1.0, 0.9, 0.8, 0.6]))
>>> [round(float(r), 2) for r in fit.ratio(np.array([2e-5, 5e-4]))]
[0.95, 0.66]
>>> RatioFit.fit(sib[:2], sib[:2] * 0.8).ratio(np.array([1e-3])).round(2).tolist()  # too few pairs: their median
[0.8]
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace

import numpy as np

from ...candidates.generate import candidate_key
from ..store.cache import measure_target

#: One region in this many (per backend, by sibling seconds) is measured to fit the scaling.
SAMPLE_EVERY = 4
#: Least regions per backend measured for the fit (all of them where a backend has fewer).
SAMPLE_MIN = 6
#: Pairs below this count fit no slope: their median ratio scales every region.
SLOPE_MIN_PAIRS = 4
#: A scaled region runs at most this many times faster or slower than on the sibling.
RATIO_CLIP = (0.25, 4.0)


@dataclass(frozen=True)
class RatioFit:
    """``log(here / sibling) = a + b * log(sibling)``, clipped to :data:`RATIO_CLIP`."""

    a: float
    b: float
    pairs: int

    @classmethod
    def fit(cls, sibling_s, here_s) -> "RatioFit":
        """The fit over the measured pairs (a median ratio, ``b = 0``, below :data:`SLOPE_MIN_PAIRS`)."""
        x, y = np.log(np.asarray(sibling_s, float)), np.log(np.asarray(here_s, float) / np.asarray(sibling_s, float))
        if len(x) < SLOPE_MIN_PAIRS or float(np.ptp(x)) == 0.0:
            return cls(float(np.median(y)), 0.0, len(x))
        b, a = np.polyfit(x, y, 1)
        return cls(float(a), float(b), len(x))

    def ratio(self, sibling_s) -> np.ndarray:
        """Seconds here over seconds on the sibling, per region of ``sibling_s`` seconds there."""
        return np.clip(np.exp(self.a + self.b * np.log(np.asarray(sibling_s, float))), *RATIO_CLIP)

    def to_json(self) -> dict:
        return {"a": round(self.a, 4), "b": round(self.b, 4), "pairs": self.pairs}


def sibling_targets(device) -> list[str]:
    """The cache targets of ``device``'s CPU at the other core counts of this machine (none for
    a device measured over RPC or not a CPU)."""
    if getattr(device, "rpc_key", "") or device.kind != "cpu" or "num-cores" not in (device.target or {}):
        return []
    here = measure_target(device)
    out = []
    for c in range(1, (os.cpu_count() or 1) + 1):
        t = measure_target(replace(device, target={**device.target, "num-cores": c}, cores=c))
        if t != here:
            out.append(t)
    return out


@dataclass
class Screen:
    """The regions of one :func:`screen` call left to scale, and what was done.

    Attributes
    ----------
    later : dict
        ``(key, backend) -> (candidate indices, sibling record)`` to scale once the sample is measured.
    sampled : dict
        ``(key, backend) -> sibling record`` of the regions measured for the fit.
    fits : dict
        Backend -> :meth:`RatioFit.to_json` (filled by :meth:`fill`).
    scaled : int
        Candidates given scaled seconds.
    """

    sibling: str
    later: dict = field(default_factory=dict)
    sampled: dict = field(default_factory=dict)
    fits: dict = field(default_factory=dict)
    scaled: int = 0

    def summary(self) -> dict:
        return {"from": json.loads(self.sibling), "scaled": self.scaled, "fits": dict(self.fits)}

    def fill(self, costs: np.ndarray, cache, tkey: str, infeasible: dict) -> dict:
        """Give the regions of :attr:`later` their scaled seconds (or ``inf`` where the sibling
        could not run them, the reason in ``infeasible``), fitted per backend on
        :attr:`sampled`'s records here and on the sibling. Returns the entries of a backend
        none of whose sample was measured here (``(key, backend) -> candidate indices``): they
        are measured instead."""
        left: dict = {}
        fits: dict = {}
        by_backend: dict = {}
        for (k, b), sib in self.sampled.items():
            rec = cache.get(k, b, tkey)
            if rec is not None and float(rec["median_s"]) > 0:
                by_backend.setdefault(b, []).append((float(sib["median_s"]), float(rec["median_s"])))
        for (k, b), (idxs, sib) in self.later.items():
            ms = float(sib["median_s"])
            if ms < 0:
                for i in idxs:
                    costs[i] = np.inf
                    infeasible[i] = sib.get("infeasible", "infeasible on another core count of this CPU")
                continue
            pairs = by_backend.get(b)
            if not pairs:  # nothing of this backend measured here (its sample failed): no fit to trust
                left[(k, b)] = idxs
                continue
            if b not in fits:
                fits[b] = RatioFit.fit(*zip(*pairs))
                self.fits[b] = fits[b].to_json()
            fit = fits[b]
            for i in idxs:
                costs[i] = ms * float(fit.ratio(ms))
                self.scaled += 1
        return left


def screen(cs, device, cache, todo: dict) -> tuple[dict, Screen | None]:
    """Split ``todo`` (``(key, backend) -> candidate indices`` still to measure on ``device``)
    into what to measure now and a :class:`Screen` of the regions to scale afterwards (None,
    and ``todo`` whole, when no sibling target holds records of them). The whole model of
    each backend, a backend's regions without a sibling record, and its sample are measured."""
    n = len(cs.rg.graph.nodes)
    best, found = None, {}
    for sib in sibling_targets(device):
        recs = {e: cache.get(e[0], e[1], sib) for e in todo}
        recs = {e: r for e, r in recs.items() if r is not None}
        if len(recs) > len(found):
            best, found = sib, recs
    if best is None:
        return todo, None
    out = Screen(best)
    now: dict = {}
    per_backend: dict = {}
    for e, idxs in todo.items():
        if e in found and len(cs[idxs[0]].nodes) < n:
            per_backend.setdefault(e[1], []).append(e)
        else:
            now[e] = idxs
    for b, entries in per_backend.items():
        entries.sort(key=lambda e: float(found[e]["median_s"]), reverse=True)
        feasible = [e for e in entries if float(found[e]["median_s"]) > 0]
        if len(feasible) <= SAMPLE_MIN:
            sample = set(feasible)
        else:
            step = min(SAMPLE_EVERY, max(1, len(feasible) // SAMPLE_MIN))
            sample = set(feasible[::step])
        for e in entries:
            if e in sample:
                now[e] = todo[e]
                out.sampled[e] = found[e]
            else:
                out.later[e] = (todo[e], found[e])
    return now, out


def screen_measurement(cs, device, cache, todo: dict, native: list) -> tuple[dict, list, Screen | None]:
    """:func:`screen` of the library entries ``todo`` and of the TVM-native candidates
    ``native`` (indices) not cached on ``device``: ``(todo, native, screen)`` to measure now
    (``screen`` None, and both whole, when nothing is to be scaled)."""
    tkey = measure_target(device)
    entries = dict(todo)
    for i in native:
        k = candidate_key(cs.rg, cs[i].nodes)
        if cache.get(k, cs[i].backend, tkey) is None:
            entries.setdefault((k, cs[i].backend), []).append(i)
    now, out = screen(cs, device, cache, entries)
    if out is None:
        return todo, native, None
    later = {i for idxs, _ in out.later.values() for i in idxs}
    return {e: v for e, v in now.items() if e in todo}, [i for i in native if i not in later], out


__all__ = ["RATIO_CLIP", "RatioFit", "SAMPLE_EVERY", "SAMPLE_MIN", "SLOPE_MIN_PAIRS", "Screen", "screen",
           "screen_measurement", "sibling_targets"]
