"""The candidates of the flow: which backends compete for each subgraph on a cluster.

:func:`make_candidates` is what :func:`tvm_pesto.place` costs and solves (re-exported as
:func:`tvm_pesto.make_candidates`); it sits with the candidates so that the cost side (this
machine's calibration, :mod:`tvm_pesto.costs.calibrate.machine`) builds the same ones without importing
the facade :mod:`tvm_pesto.api`.

Examples
--------
>>> backend_names("all") is None, backend_names("torch, onnxruntime")
(True, ['tvm', 'torch', 'onnxruntime'])
>>> "inductor" in backend_names("all,inductor") and "onnxruntime" in backend_names("all,inductor")
True
"""
from __future__ import annotations

import warnings

from ..backends import available_backends, backend_status, get_backend, list_backends
from ..backends.registry import NAMED_ONLY
from ..cluster import as_cluster
from ..errors import PestoError
from .generate import generate_candidates, placement_candidates

#: Backends asked for by name that were unavailable and have been warned about (once each).
_WARNED: set = set()


def backend_names(backends) -> list[str] | None:
    """``"all"`` -> None (every registered backend but those offered only when named,
    :data:`~tvm_pesto.backends.registry.NAMED_ONLY`); ``"tvm"`` -> ["tvm"]; a comma-separated
    string or a list -> that list (``tvm`` added: it covers every op), where ``all`` stands
    for every registered backend (``"all,openvino-bf16"``: those and a named-only one).

    Raises
    ------
    PestoError
        For an unknown backend name (the message lists the known ones).
    """
    if backends is None or backends == "all":
        return None
    names = [b.strip() for b in backends.split(",")] if isinstance(backends, str) else [str(b) for b in backends]
    names = [n for n in names if n]
    if not names:
        raise PestoError("no backend named; use --backends all, tvm, or a comma-separated list of backend names")
    for n in names:
        if n != "all":
            get_backend(n)  # unknown names fail here, listing the known ones
    if "all" in names:
        every = [n for n in list_backends() if n not in NAMED_ONLY]
        names = every + [n for n in names if n not in every and n != "all"]
    return ["tvm"] + [n for n in dict.fromkeys(names) if n != "tvm"]


#: ``precision`` of :func:`tvm_pesto.build`: ``fp32`` (default: every backend computes in
#: float32) or ``bf16`` (the backends that compute in bfloat16 on this CPU compete too).
PRECISIONS = ("fp32", "bf16")


def with_precision(backends, precision: str = "fp32"):
    """``backends`` with, for ``precision="bf16"``, every backend that computes in bfloat16
    (a ``precision`` of ``bf16``: ``openvino-bf16``) and can run here added beside them.

    Raises
    ------
    PestoError
        An unknown precision, or ``bf16`` where no backend can compute in bfloat16 on this CPU
        (the message says why each cannot).

    Examples
    --------
    >>> with_precision("all", "fp32")
    'all'
    """
    if precision not in PRECISIONS:
        raise PestoError(f"unknown precision {precision!r}; use one of {', '.join(PRECISIONS)}")
    if precision == "fp32":
        return backends
    reduced = [n for n in list_backends() if getattr(get_backend(n), "precision", "f32") == "bf16"]
    status = backend_status(reduced)
    usable = [n for n in reduced if status[n][0]]
    if not usable:
        why = "; ".join(f"{n}: {status[n][1]}" for n in reduced) or "no such backend is registered"
        raise PestoError(f"precision bf16: no backend can compute in bfloat16 on this CPU ({why}); "
                         "use precision fp32")
    names = backend_names(backends) or ["all"]
    return names + [n for n in usable if n not in names]


def _named(backends) -> set:
    """The backend names ``backends`` spells out (not those ``all`` stands for)."""
    if backends is None or isinstance(backends, str) and backends.strip() == "all":
        return set()
    names = backends.split(",") if isinstance(backends, str) else [str(b) for b in backends]
    return {n.strip() for n in names if n.strip() and n.strip() != "all"}


def make_candidates(analysis, cluster, backends="all", max_region: int = 40):
    """The candidates of the flow: which subgraphs each available backend could run.

    ``analysis`` is a :class:`~tvm_pesto.graph.analysis.Analysis`. ``backends="tvm"`` gives
    TVM's fusion groups only (one candidate per group). Backends asked for by name that cannot
    run here are reported once with a warning that names what stands in (TVM); with ``"all"``
    they are only listed in ``unavailable``. A backend asked for by name that cannot run here
    but runs on a kind of device the cluster has and this machine does not (``present`` is
    false for all of them, e.g. the ``h200`` preset on a machine without GPUs) is a candidate
    all the same: the plan is for that machine, and the module is built where the backend loads
    (:func:`~tvm_pesto.builder.lower.lower_units` with ``build=False`` names its units here).

    Returns
    -------
    CandidateSet
        ``unavailable`` maps each backend left out to the reason.
    """
    cluster = as_cluster(cluster)
    names = backend_names(backends)
    if names == ["tvm"]:
        return placement_candidates(analysis.rg, analysis.groups)
    usable, why, seen = [], {}, set()
    named = _named(backends)  # spelled out, not stood for by "all"
    for kind in sorted({d.kind for d in cluster.devices}):
        got, reasons = available_backends(names, device_kind=kind)
        got += _elsewhere(None if names is None else [n for n in names if n in named], reasons, cluster, kind)
        for b in got:
            if b.name not in seen:
                seen.add(b.name)
                usable.append(b)
        for k, v in reasons.items():
            why.setdefault(k, v)
    for b in usable:
        why.pop(b.name, None)
    if names is not None:
        for n in sorted(named):
            if n in why and n not in _WARNED:
                _WARNED.add(n)
                warnings.warn(f"backend {n!r} is unavailable ({why[n]}); its subgraphs stay on tvm", RuntimeWarning,
                              stacklevel=3)
    cs = generate_candidates(analysis.rg, usable, max_region=max_region)
    cs.unavailable = {**why, **cs.unavailable}  # and those whose checks failed on this graph
    return cs


def _elsewhere(names, reasons: dict, cluster, kind: str) -> list:
    """The backends of ``names`` that cannot run here (``reasons``) but run on ``kind`` devices,
    when none of the cluster's ``kind`` devices is on this machine; they leave ``reasons``."""
    if names is None or any(d.present for d in cluster.devices if d.kind == kind):
        return []
    out = []
    for n in names:
        bk = get_backend(n)
        if n in reasons and kind in bk.device_kinds:
            reasons.pop(n)
            out.append(bk)
    return out


__all__ = ["PRECISIONS", "backend_names", "make_candidates", "with_precision"]
