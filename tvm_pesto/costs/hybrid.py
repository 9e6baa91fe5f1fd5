"""The ``hybrid`` cost source: predict every candidate, measure only where the choice is uncertain.

1. Every candidate is predicted by the cost model (:func:`tvm_pesto.costs.xgb.predict_candidate_costs`).
2. Uncertain candidates are picked per op: of the candidates that contain the op, the
   ``top_k`` cheapest per op (predicted cost divided by their size) whose share is within the
   model's error (``error``, relative) of the best one; plus, for the ops on the predicted
   critical path (the longest path with each op at its best predicted share), the ``top_k``
   cheapest candidates whatever their margin.
3. Those are measured (:mod:`tvm_pesto.costs.measured`, cached), on the devices that are on
   this machine, and replace their predictions.
4. The remaining predictions of each backend on each device are scaled by the median of
   measured / predicted over that backend's measured candidates there (at least
   ``min_samples`` of them): the model's bias on this machine, corrected by what was seen.

The :class:`~tvm_pesto.costs.CostTable` says how many candidates were measured, how many
predicted, and an estimate of the profiling time saved (measured candidates' mean time to
measure, times the ones not measured).

Examples
--------
>>> from tvm_pesto.costs import candidate_costs           # doctest: +SKIP
>>> ct = candidate_costs(cs, cluster, "hybrid")            # doctest: +SKIP
>>> ct.measured, ct.predicted, ct.saved_s                  # doctest: +SKIP
"""
from __future__ import annotations

import numpy as np

#: Relative error of the model's predictions used to call two candidates "too close".
DEFAULT_ERROR = 0.25


def _best_shares(graph, candidates, table: np.ndarray) -> np.ndarray:
    """Per op: the smallest predicted ``cost / size`` over the candidates containing it."""
    best = np.full(graph.num_nodes, np.inf)
    cheapest = np.where(np.isfinite(table), table, np.inf).min(axis=1)
    for c, cand in enumerate(candidates):
        share = cheapest[c] / max(len(cand.nodes), 1)
        idx = list(cand.nodes)
        best[idx] = np.minimum(best[idx], share)
    return best


def critical_ops(graph, shares: np.ndarray) -> list[int]:
    """Ops on the longest path with each op weighted by ``shares``."""
    w = np.where(np.isfinite(shares), shares, 0.0)
    finish = np.zeros(graph.num_nodes)
    prev = np.full(graph.num_nodes, -1)
    for v in graph.topo_order():
        preds = list(graph.dag.predecessors(v))
        if preds:
            u = max(preds, key=lambda p: finish[p])
            finish[v] = finish[u] + w[v]
            prev[v] = u
        else:
            finish[v] = w[v]
    if not graph.num_nodes:
        return []
    v, path = int(np.argmax(finish)), []
    while v >= 0:
        path.append(v)
        v = int(prev[v])
    return path[::-1]


def uncertain_candidates(graph, candidates, table: np.ndarray, error: float = DEFAULT_ERROR,
                         top_k: int = 3) -> list[int]:
    """Indices of the candidates worth measuring (see the module doc).

    Examples
    --------
    >>> from tvm_pesto.candidates import Candidate
    >>> from tvm_pesto.graph import OpGraph, OpNode
    >>> g = OpGraph([OpNode("a", "relax.add"), OpNode("b", "relax.add")], [(0, 1, 4)])
    >>> cands = [Candidate("tvm", (0,)), Candidate("ort", (0,)), Candidate("tvm", (1,)), Candidate("ort", (1,))]
    >>> t = np.array([[1.0], [1.1], [1.0], [5.0]])   # op a: a close call; op b: tvm clearly wins
    >>> uncertain_candidates(g, cands, t, top_k=2) == [0, 1, 2, 3]   # b is on the critical path
    True
    >>> uncertain_candidates(g, cands, t, top_k=1)
    [0, 2]
    """
    cheapest = np.where(np.isfinite(table), table, np.inf).min(axis=1)
    containing: list[list[int]] = [[] for _ in range(graph.num_nodes)]
    for c, cand in enumerate(candidates):
        if np.isfinite(cheapest[c]):
            for v in cand.nodes:
                containing[v].append(c)
    critical = set(critical_ops(graph, _best_shares(graph, candidates, table)))
    chosen: set[int] = set()
    for v in range(graph.num_nodes):
        ranked = sorted(containing[v], key=lambda c: (cheapest[c] / len(candidates[c].nodes), c))
        if not ranked:
            continue
        best = cheapest[ranked[0]] / len(candidates[ranked[0]].nodes)
        close = [c for c in ranked if cheapest[c] / len(candidates[c].nodes) <= best * (1.0 + error)]
        chosen.update((ranked if v in critical else close)[:top_k])
    return sorted(chosen)


def hybrid_costs(cs, cluster, cache=None, progress=None, error: float = DEFAULT_ERROR, top_k: int = 3,
                 min_samples: int = 3):
    """The hybrid table (see the module doc): a :class:`~tvm_pesto.costs.CostTable`."""
    from .table import CostTable
    from .measured import MeasureReport, measure_cost_table
    from .xgb import predict_candidate_costs

    table, columns = predict_candidate_costs(cs, cluster)
    table = table.copy()
    graph = cs.rg.graph
    picked = uncertain_candidates(graph, list(cs), table, error=error, top_k=top_k)
    present = [j for j, d in enumerate(cluster.devices) if d.present]
    report = MeasureReport()
    corrections: dict = {}
    if picked and present:
        from ..candidates.generate import CandidateSet

        sub = CandidateSet(cs.rg, [cs[i] for i in picked])
        from ..cluster.cluster import Cluster

        local = Cluster(cluster.name, [cluster.devices[j] for j in present],
                        cluster.latency[np.ix_(present, present)], cluster.bandwidth[np.ix_(present, present)])
        measured = measure_cost_table(sub, local, cache, report=report, progress=progress)
        backends = np.array([c.backend for c in cs])
        picked_arr = np.asarray(picked)
        for jj, j in enumerate(present):
            pred = table[picked_arr, j].copy()
            meas = measured[:, jj]
            table[picked_arr, j] = meas
            for b in sorted(set(backends[picked_arr])):
                sel = (backends[picked_arr] == b) & np.isfinite(meas) & np.isfinite(pred) & (pred > 0)
                if sel.sum() < min_samples:
                    continue
                f = float(np.median(meas[sel] / pred[sel]))
                rest = np.flatnonzero((backends == b) & ~np.isin(np.arange(len(cs)), picked_arr))
                table[rest, j] *= f
                corrections[f"{j}:{b}"] = f
            columns[j] = "hybrid"
    n_measured = len(picked) if present else 0
    per = report.seconds / max(report.measured, 1)
    return CostTable(table, columns, measured=report.measured, cached=report.cached,
                     predicted=len(cs) - n_measured, infeasible={picked[i]: why for i, why in report.infeasible.items()},
                     calibration={"bias": corrections}, seconds=report.seconds,
                     saved_s=float(per * (len(cs) - n_measured) * len(present)) if report.measured else 0.0)


__all__ = ["DEFAULT_ERROR", "critical_ops", "hybrid_costs", "uncertain_candidates"]
