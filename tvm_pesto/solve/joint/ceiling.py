"""How much a mix of backends could gain at most on one device: the ceiling of the cover.

Collage's cover (:mod:`tvm_pesto.solve.joint.cover`) beats the best single backend only when some
region is faster in another library, and by more than the extra library calls at the
region's boundaries cost. :func:`mix_ceiling` separates the two. On one device's costs it
solves each backend alone (:func:`alone`: its whole-model call) and the cover over every
backend with **free boundaries**: each library call's fixed cost taken off every candidate
of that library, and one call's added back. A backend's fixed cost per call is what a call
of a one-op model costs where that was measured (``fixed_s``), and at most its cheapest
candidate (no call of it costs less); the smallest of them is added back. So no cover of
these candidates at these costs that makes at least one library call beats the best single
backend by more than ``ceiling``: each of its calls costs its candidate's free cost plus its
fixed cost, and the free costs of the cheapest free cover plus one smallest fixed cost are
no more. Candidates of ``native``
backends (compiled into the module's own segments, no call of their own) keep their costs.

A ceiling near 1 says that on this machine no region of this model is enough faster in
another library for any search to find a mix worth having; a ceiling well above what the
cover reaches says the boundaries eat the gain (fewer, cheaper calls would pay).

Examples
--------
Two ops; library ``a`` does the first in 2.0 and the second in 4.0, library ``b`` the other
way round; a call costs 1.0 beyond its work, and each library also runs both ops as one call:

>>> import numpy as np
>>> from tvm_pesto.candidates import Candidate
>>> from tvm_pesto.graph import OpGraph, OpNode
>>> g = OpGraph([OpNode("x", "relax.matmul"), OpNode("y", "relax.nn.relu")], [(0, 1, 4)])
>>> cands = [Candidate("a", (0,)), Candidate("a", (1,)), Candidate("a", (0, 1)),
...          Candidate("b", (0,)), Candidate("b", (1,)), Candidate("b", (0, 1))]
>>> c = mix_ceiling(g, cands, np.array([3.0, 5.0, 7.0, 5.0, 3.0, 7.0]))
>>> c["best_single"], c["best_single_s"], c["mix_s"], round(c["mix"], 3)
('a', 7.0, 6.0, 1.167)

The mix (``a`` then ``b``) takes 6.0 against 7.0. With no fixed cost measured, each
library's is taken as its cheapest call (3.0, of which 2.0 is work), so the free-boundary
cover costs next to nothing plus one call, and the ceiling (7.0 / 3.0) is well above the
true one; with the fixed cost measured (1.0) it is the true one, 7.0 / (2.0 + 2.0 + 1.0):

>>> c["fixed_s"], round(c["free_boundaries_s"], 3), round(c["ceiling"], 3)
({'a': 3.0, 'b': 3.0}, 3.0, 2.333)
>>> costs = np.array([3.0, 5.0, 7.0, 5.0, 3.0, 7.0])
>>> round(mix_ceiling(g, cands, costs, fixed_s={"a": 1.0, "b": 1.0})["ceiling"], 3)
1.4
"""
from __future__ import annotations

import numpy as np

from ...errors import InfeasibleError
from .cover import best_cover

#: The floor of a candidate's cost once its call's fixed cost is taken off (seconds): a
#: candidate never costs nothing, so covers stay comparable.
MIN_S = 1e-9


def restrict_to(candidates, costs: np.ndarray, backend: str, fallback: str = "tvm") -> np.ndarray:
    """Costs of ``backend`` alone: its own candidates, plus ``fallback``'s candidates made only of
    ops ``backend`` has no usable candidate for (``inf`` elsewhere), so a backend that lacks an
    op still covers the model.

    ``costs`` has one row per candidate (one column per device, or a vector).

    Examples
    --------
    >>> import numpy as np
    >>> from tvm_pesto.candidates import Candidate
    >>> cands = [Candidate("tvm", (0,)), Candidate("tvm", (1,)), Candidate("ort", (0,))]
    >>> restrict_to(cands, np.array([1.0, 2.0, 0.5]), "ort").tolist()
    [inf, 2.0, 0.5]
    """
    costs = np.asarray(costs, dtype=np.float64)
    fin = np.isfinite(costs).any(axis=1) if costs.ndim == 2 else np.isfinite(costs)
    mine = np.array([c.backend == backend for c in candidates])
    coverable = {v for c, m, f in zip(candidates, mine, fin) if m and f for v in c.nodes}
    keep = np.array([m or (c.backend == fallback and not (set(c.nodes) & coverable))
                     for c, m in zip(candidates, mine)])
    out = costs.copy()
    out[~keep] = np.inf
    return out


def alone(candidates, costs: np.ndarray, backend: str, num_nodes: int, fallback: str = "tvm") -> np.ndarray:
    """Costs of ``backend`` alone as its users run it: its whole-model candidate only, where
    it has a usable one (one call of the library), else :func:`restrict_to` (its cheapest
    cover, ``fallback`` for the ops it lacks). A cover of several calls of one library can
    be predicted a little under its whole-model call and run well over it (the regions'
    boundaries undo the library's own fusion and memory planning), so a library's single
    figure is its one call.

    Examples
    --------
    >>> import numpy as np
    >>> from tvm_pesto.candidates import Candidate
    >>> cands = [Candidate("ort", (0,)), Candidate("ort", (1,)), Candidate("ort", (0, 1)), Candidate("tvm", (0,)),
    ...          Candidate("tvm", (1,))]
    >>> alone(cands, np.array([1.0, 1.0, 2.5, 3.0, 3.0]), "ort", 2).tolist()
    [inf, inf, 2.5, inf, inf]
    >>> alone(cands, np.array([1.0, 1.0, 2.5, 3.0, 3.0]), "tvm", 2).tolist()
    [inf, inf, inf, 3.0, 3.0]
    """
    costs = np.asarray(costs, dtype=np.float64)
    fin = np.isfinite(costs).any(axis=1) if costs.ndim == 2 else np.isfinite(costs)
    whole = [i for i, c in enumerate(candidates) if c.backend == backend and len(c.nodes) == num_nodes and fin[i]]
    if not whole:
        return restrict_to(candidates, costs, backend, fallback)
    out = np.full_like(costs, np.inf)
    out[whole] = costs[whole]
    return out


def mix_ceiling(graph, candidates, costs, fixed_s: dict | None = None, native=("tvm",),
                fallback: str = "tvm") -> dict:
    """The best single backend, Collage's cover and the cover with free boundaries, on one
    device's ``costs`` (one entry per candidate, ``inf`` where it cannot run).

    ``fixed_s``: backend -> the fixed cost of one of its calls where it was measured (a call
    of a one-op model); a backend's fixed cost is that or its cheapest candidate, whichever
    is smaller (no call costs less than its fixed cost).

    Returns
    -------
    dict
        ``single_s`` (backend -> seconds of it alone, :func:`alone`; ``native`` and
        ``fallback`` backends not listed on their own), ``best_single`` and ``best_single_s``, ``mix_s``
        (the cover over every backend), ``fixed_s`` (backend -> the fixed cost taken off each
        of its calls), ``free_boundaries_s`` (the cover with every
        call's fixed cost taken off, plus the smallest fixed cost of any library: a cover
        makes at least one call), ``free_mix`` (backend ->
        ops in that cover), ``mix`` (``mix_s``'s speedup over the best single backend) and
        ``ceiling`` (``free_boundaries_s``'s).

    Raises
    ------
    InfeasibleError
        When no backend other than ``native``/``fallback`` ones has a cover of its own.
    """
    costs = np.asarray(costs, dtype=np.float64)
    sets = [list(c.nodes) for c in candidates]
    libraries = sorted({c.backend for c, v in zip(candidates, costs)
                        if np.isfinite(v) and c.backend not in native and c.backend != fallback})
    single = {}
    for b in libraries:
        try:
            single[b] = best_cover(graph, sets, alone(candidates, costs, b, graph.num_nodes, fallback)).cost
        except InfeasibleError:  # the fallback does not cover what this backend lacks
            continue
    if not single:
        raise InfeasibleError("no library backend covers this model on this device (with the fallback "
                              f"{fallback!r} for the ops it lacks); a mix ceiling needs at least one")
    best = min(single, key=single.get)
    fixed = {}
    for c, v in zip(candidates, costs):
        if np.isfinite(v) and c.backend not in native:
            fixed[c.backend] = min(fixed.get(c.backend, np.inf), float(v),
                                   float((fixed_s or {}).get(c.backend, np.inf)))
    free = np.array([max(v - fixed.get(c.backend, 0.0), MIN_S) if np.isfinite(v) else v
                     for c, v in zip(candidates, costs)])
    mix = best_cover(graph, sets, costs)
    cover = best_cover(graph, sets, free)
    ops: dict[str, int] = {}
    for i in cover.chosen:
        ops[candidates[i].backend] = ops.get(candidates[i].backend, 0) + len(candidates[i].nodes)
    free_s = cover.cost + min(fixed.values(), default=0.0)
    return {"single_s": single, "best_single": best, "best_single_s": single[best], "mix_s": mix.cost,
            "fixed_s": fixed, "free_boundaries_s": free_s, "free_mix": ops,
            "mix": single[best] / mix.cost, "ceiling": single[best] / free_s}


__all__ = ["MIN_S", "alone", "mix_ceiling", "restrict_to"]
