"""The profiler: measure every candidate of a model and log what a cost model needs.

``tvm-pesto profile MODEL`` measures each candidate subgraph of a model on the local
CPU devices, through the same code the ``measured`` cost source uses
(:func:`tvm_pesto.costs.timing.measure_groups` for TVM, and
:func:`tvm_pesto.costs.measured.measure_candidates` for the other backends), and appends one
JSON line per measurement to a log.

The log is a :class:`~tvm_pesto.costs.cache.MeasureCache` file (``key``, ``backend``,
``target``, ``median_s``, ``repeats``, ``op``, ``flops``, ``bytes``) with extra fields
that let a model be trained without the IR (records are appended atomically, so two
``tvm-pesto profile`` runs may share one log):

``desc``
    :func:`tvm_pesto.costs.features.describe_group` of the subgraph (op list, dominant op
    shapes and attributes, FLOPs, bytes, weight bytes, bytes saved by fusion).
``device_desc``
    peak FLOP/s, bandwidth, memory, cores, kind and model of the device.
``model``, ``nodes``, ``load``, ``host``, ``call_overhead_s``
    where it came from, which op-graph nodes, ``os.getloadavg()`` when it was written
    (to judge noise), the host name, the VM call overhead measured in the same run.
``backend_stamp``
    for ``tvm-ms`` records, the tuning database they were measured with
    (:func:`tvm_pesto.costs.cache.backend_stamp`); after more tuning the same
    subgraphs are measured again.

Records are deduplicated per (key, backend, target, model, run): profiling a model twice
measures nothing the second time, but a shape shared by two models is measured in both
runs, and a pass with another ``run`` label measures everything again (training takes
the fastest pass; the spread between passes is the run-to-run noise).

Examples
--------
>>> from tvm_pesto_lab.profile import profile_module
>>> from tvm_pesto_lab.sweep import sweep_module
>>> import os, tempfile
>>> log = os.path.join(tempfile.mkdtemp(), "prof.jsonl")
>>> res = profile_module(sweep_module("pool", limit=1), "pool", "cpu:1", log)
>>> res.candidates, sorted(res.backends), res.errors
(3, ['onnxruntime', 'torch', 'tvm'], {})
"""
from __future__ import annotations

import json
import multiprocessing
import os
import queue
import re
import socket
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tvm_pesto.backends import available_backends, backend_status, get_backend
from tvm_pesto.candidates import candidate_function, candidate_key, generate_candidates
from tvm_pesto.cluster import as_cluster
from tvm_pesto.costs.store.cache import MeasureCache, current_record, measure_target
from tvm_pesto.costs.predict.features import describe_group, device_descriptor
from tvm_pesto.costs.store.jsonl import open_log, read_records
from tvm_pesto.costs.measure.measured import MeasureReport, measure_candidates
from tvm_pesto.costs.measure.timing import measure_groups
from tvm_pesto.errors import BuildError, CostError, PestoError
from tvm_pesto.graph.analysis import analyze
from tvm_pesto.graph.subgraph import structural_key
from tvm_pesto.package_data import cache_root
from .families import model_module
from .sweep import FAMILIES, sweep_module

#: Backends profiled when none are named.
DEFAULT_BACKENDS = ("tvm", "onnxruntime", "torch")


class ProfileLog(MeasureCache):
    """A measurement log that adds the feature description to every record it writes.

    It behaves like :class:`MeasureCache` for the measuring code, except that lookups
    only see records of the current ``model`` (so each model's log is complete).

    Parameters
    ----------
    path : path-like
        The JSON-lines file (appended to).
    model : str
        Name written into each record (used to split data by model).
    run : str
        A label for a repeated profiling pass: records are deduplicated per run, so a second
        pass with another label measures everything again (training takes the fastest pass).
    """

    def __init__(self, path, model: str = "", run: str = ""):
        self.model = model
        self.run = run
        self.descs: dict[str, dict] = {}  # structural key -> description
        self.nodes: dict[str, list[int]] = {}  # structural key -> op-graph node ids
        self.devices: dict[str, dict] = {}  # target key -> device descriptor
        self.tuned: dict[tuple, float] = {}  # (structural key, target key) -> tvm-ms tuned share
        self.written = 0
        self._mine: dict[tuple, dict] = {}
        super().__init__(path)

    def _index(self, k: tuple[str, str, str], rec: dict) -> None:
        self.entries[k] = rec
        self._mine[k + (rec.get("model", ""), rec.get("run", ""))] = rec

    def get(self, key: str, backend: str, target: str) -> dict | None:
        return current_record(self._mine.get((key, backend, target, self.model, self.run)), backend)

    def put(self, rec: dict) -> None:
        rec = dict(rec)
        rec["model"] = self.model
        if self.run:
            rec["run"] = self.run
        desc = self.descs.get(rec["key"])
        if desc is not None:
            rec["desc"] = desc
            rec["nodes"] = self.nodes.get(rec["key"], [])
        dev = self.devices.get(rec["target"])
        if dev is not None:
            rec["device_desc"] = dev
        share = self.tuned.get((rec["key"], rec["target"]))
        if rec["backend"] == "tvm-ms" and share is not None:
            rec["tuned"] = round(share, 4)
        if isinstance(rec.get("repeats"), list):  # 5 significant digits keep the log small
            rec["repeats"] = [float(f"{x:.5g}") for x in rec["repeats"]]
        rec["load"] = [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None
        rec["host"] = socket.gethostname()
        with self._lock:
            self._mine[(rec["key"], rec["backend"], rec["target"], self.model, self.run)] = rec
            self.written += 1
        super().put(rec)


def default_backends() -> list[str]:
    """:data:`DEFAULT_BACKENDS`, and ``tvm-ms`` when it has a tuning database
    (``--ms-db`` or ``TVM_PESTO_MS_DB``)."""
    return list(DEFAULT_BACKENDS) + (["tvm-ms"] if backend_status(["tvm-ms"])["tvm-ms"][0] else [])


@dataclass
class ProfileResult:
    """What one profile run did."""

    model: str
    candidates: int = 0
    measured: int = 0
    cached: int = 0
    infeasible: int = 0
    seconds: float = 0.0
    backends: dict = field(default_factory=dict)
    errors: dict = field(default_factory=dict)
    pid: int = 0  # the process that measured it


def _units(rg, groups, backends):
    """Candidates to measure: ``(CandidateSet or None, [(backend, nodes)])``."""
    usable, why = available_backends(list(backends))
    cs = generate_candidates(rg, usable)
    return cs, why


def _register_descs(log: ProfileLog, rg, units) -> None:
    """Compute the structural key of every unit (the function it is timed as) and map it to
    its description."""
    seen: set = set()
    for backend, nodes in units:
        nodes = tuple(sorted(nodes))
        if nodes in seen:
            continue
        seen.add(nodes)
        desc = describe_group(rg.graph, nodes)
        try:
            k = candidate_key(rg, list(nodes))
        except Exception:  # noqa: BLE001 - a unit that cannot be cut is reported by the measuring code
            continue
        log.descs.setdefault(k, desc)
        log.nodes.setdefault(k, list(nodes))


def _register_tuned(log: ProfileLog, cs, dev, tk: str) -> None:
    """Record the tuned share (``TvmMetaScheduleBackend.tuned_fraction``, the ``tuned``
    feature) of every ``tvm-ms`` candidate on ``dev``, written into its record as ``tuned``."""
    backend = get_backend("tvm-ms")
    for c in cs:
        if c.backend == "tvm-ms":
            func = candidate_function(cs.rg, list(c.nodes), lift_constants=True).func
            k = structural_key(func)
            if (k, tk) not in log.tuned:
                try:
                    log.tuned[(k, tk)] = backend.tuned_fraction(func, dict(dev.target))
                except BuildError:
                    pass  # it will not build either: measuring records it as infeasible


def profile_module(mod, name: str, cluster="cpu:1", log_path="cost_models/profile.jsonl",
                   backends=DEFAULT_BACKENDS, progress=None, repeat: int = 5,
                   min_repeat_ms: int = 5, run: str = "") -> ProfileResult:
    """Measure every candidate of ``mod`` on the local devices of ``cluster`` and log it.

    Parameters
    ----------
    mod : tvm.IRModule
    name : str
        Model name recorded in each log line (the held-out split is by this name).
    cluster : str or Cluster
        Only present devices are measured; devices with the same target share a run.
    log_path : path-like
        JSON-lines log to append to.
    backends : sequence of str
        ``"tvm"`` alone measures the fusion groups; with other backends every candidate of
        :func:`tvm_pesto.candidates.generate_candidates` is measured.
    progress : callable(done, total), optional
    repeat, min_repeat_ms : int
        Timed repeats per candidate (the median is logged) and the least milliseconds each
        repeat runs; more repeats give less noisy training data.
    run : str
        Label of a repeated pass (see :class:`ProfileLog`).

    Returns
    -------
    ProfileResult

    Examples
    --------
    >>> from tvm_pesto_lab.sweep import sweep_module
    >>> import os, tempfile
    >>> log = os.path.join(tempfile.mkdtemp(), "p.jsonl")
    >>> res = profile_module(sweep_module("pool", limit=2), "pool", "cpu:1", log, backends=["tvm"])
    >>> res.candidates, res.backends    # TVM's fusion groups only
    (2, {'tvm': 2})
    """
    t0 = time.perf_counter()
    cl = as_cluster(cluster)
    devs = [d for d in cl.devices if d.present or d.remote]
    if not devs:
        raise CostError(f"cluster {cl.name} has no device on this machine, so nothing can be profiled; "
                        "use cpu:N (train a GPU model from logs written on a GPU machine), or profile a remote "
                        "device over TVM RPC (--rpc-tracker HOST:PORT --rpc-key KEY)")
    analysis = analyze(mod)
    rg = analysis.rg
    log = ProfileLog(log_path, model=name, run=run)
    res = ProfileResult(model=name)
    backends = list(backends)
    cs = None
    if backends != ["tvm"]:
        try:
            cs, why = _units(rg, analysis.groups, backends)
            res.errors.update({k: f"unavailable: {v}" for k, v in why.items()})
        except ImportError as e:
            res.errors["candidates"] = f"candidate generation is unavailable ({e}); measuring TVM fusion groups"
            cs = None
    if cs is not None:
        units = [(c.backend, c.nodes) for c in cs]
        res.backends = cs.by_backend()
    else:
        units = [("tvm", tuple(g)) for g in analysis.groups]
        res.backends = {"tvm": len(units)}
    res.candidates = len(units)
    _register_descs(log, rg, units)
    done: set = set()
    for dev in devs:
        tk = measure_target(dev)
        if (tk, dev.cores, dev.kind) in done:
            continue
        done.add((tk, dev.cores, dev.kind))
        log.devices[tk] = device_descriptor(dev)
        if cs is not None:
            _register_tuned(log, cs, dev, tk)
        before = log.written
        if cs is not None:
            rep = MeasureReport()
            costs = measure_candidates(cs, dev, log, repeat=repeat, min_repeat_ms=min_repeat_ms, report=rep,
                                       progress=progress)
            res.infeasible += int(np.sum(~np.isfinite(costs)))
        else:
            measure_groups(rg, analysis.groups, dev, log, repeat=repeat, min_repeat_ms=min_repeat_ms, progress=progress)
        res.measured += log.written - before
    res.cached = max(res.candidates * len(done) - res.measured, 0)
    res.seconds = time.perf_counter() - t0
    return res


@dataclass(frozen=True)
class ProfileSettings:
    """What :func:`profile_zoo` measures of each model, and how.

    Attributes
    ----------
    size, backends : str, sequence of str
        Zoo model size (``small`` or ``full``), and the backends whose candidates are measured.
    repeat, min_repeat_ms : int
        Timed repeats per candidate (the median is logged), and least milliseconds per repeat.
    run : str
        Label of a repeated pass: measures again what another pass measured."""

    size: str = "small"
    backends: tuple = DEFAULT_BACKENDS
    repeat: int = 5
    min_repeat_ms: int = 5
    run: str = ""


def profile_zoo(names, cluster="cpu:1", log_path="cost_models/profile.jsonl", settings=ProfileSettings(),
                progress=None, on_model=None, fresh_process: bool = True) -> list[ProfileResult]:
    """Profile zoo models, models of :mod:`tvm_pesto.zoo.outside` and corpus models (``corpus:NAME``,
    :func:`~tvm_pesto_lab.families.model_module`; ``"sweep"`` or
    ``"sweep-<family>"`` names profile the shape sweeps), as ``settings`` say.

    With ``fresh_process`` (default; for a ``cpu:N`` cluster given by name) each model, and
    each sweep family, is measured in a process of its own (``spawn``; ``progress`` is called
    in this process, fed through a queue): in one long process OpenVINO's two-thread calls
    grew 3-4x slower by the last models, and the labels with them (docs/cost_model.md); a script that calls this
    needs the ``if __name__ == "__main__":`` guard ``spawn`` asks for. A model that fails
    is reported in its result's ``errors`` and the others go on.

    Examples
    --------
    >>> profile_zoo(["mlp_mixer"], log_path="p.jsonl")   # measures for minutes  # doctest: +SKIP
    """
    out = []
    for name in names:
        parts = [f"sweep-{f}" for f in FAMILIES] if name == "sweep" else [name]
        for part in parts:
            s = settings
            args = (part, s.size, cluster, log_path, s.backends, s.repeat, s.min_repeat_ms, s.run)
            if fresh_process and isinstance(cluster, str):
                r = _in_fresh_process(args, progress)
            else:
                r = _profile_one(*args, progress=progress)
            out.append(r)
            if on_model:
                on_model(r)
    return out


class _QueueProgress:
    """A ``progress(done, total)`` that a spawned process can call: it puts the pair on a
    queue the parent reads."""

    def __init__(self, q):
        self.queue = q

    def __call__(self, done, total) -> None:
        self.queue.put((done, total))


def _in_fresh_process(args, progress) -> "ProfileResult":
    """:func:`_profile_one` in a spawned process; its progress reaches ``progress`` here."""
    ctx = multiprocessing.get_context("spawn")
    if progress is None:
        with ProcessPoolExecutor(1, mp_context=ctx) as pool:
            return pool.submit(_profile_one, *args).result()
    with ctx.Manager() as manager, ProcessPoolExecutor(1, mp_context=ctx) as pool:
        q = manager.Queue()
        fut = pool.submit(_profile_one, *args, progress=_QueueProgress(q))
        while not (fut.done() and q.empty()):
            try:
                progress(*q.get(timeout=0.2))
            except queue.Empty:
                pass
        return fut.result()


def _profile_one(name, size, cluster, log_path, backends, repeat, min_repeat_ms, run, progress=None):
    """:func:`profile_module` of one zoo model, model outside the zoo, corpus model or sweep family."""
    try:
        if name.startswith("sweep-"):
            mod, label = sweep_module(name[len("sweep-"):]), name
        else:
            mod, label = model_module(name, size), name if size == "small" else f"{name}:{size}"
        r = profile_module(mod, label, cluster, log_path, backends, progress, repeat, min_repeat_ms, run)
    except PestoError as e:
        r = ProfileResult(model=name, errors={"profile": str(e)})
    r.pid = os.getpid()
    return r


#: Fields a merged log keeps (what training, evaluation and MeasureCache read).
MERGED_FIELDS = ("key", "backend", "target", "median_s", "repeats", "runs", "model", "nodes", "desc", "device_desc",
                 "load", "infeasible", "tuned")


def merge_logs(paths, out, reduce: str = "min", assume_cpu_kind: str | None = None) -> dict:
    """Write one compact record per (key, backend, target, CPU kind, model) from profiler logs.

    Repeated passes (``run`` labels) are merged: ``median_s`` becomes the smallest
    (``reduce="min"``, default) or the median (``"median"``) of the passes' medians,
    ``runs`` lists them all, ``repeats`` and ``load`` are the first pass's. A merged log
    merges again with the passes its records' ``runs`` hold (the bundled log and a new pass). On a shared
    machine interference only ever adds time, so the fastest pass is the most
    reproducible estimate of a subgraph's own cost.
    Fields training does not read (``host``, ``time``, the MeasureCache summary fields
    ``op``/``flops``/``bytes``, which ``desc`` holds) are dropped, so a bundled log stays small.
    Malformed lines (and a last line cut short by a crash) are skipped and reported with
    their line numbers. Records of two kinds of CPU (``device_desc["cpu_kind"]``) stay apart;
    ``assume_cpu_kind`` (``vendor/family/model``) is written into the CPU records that have
    none (logged before tvm-pesto recorded it: say which CPU they were measured on).
    An ``out`` ending in ``.gz`` is written gzip-compressed (as the bundled log is); ``paths``
    may be plain or compressed (:func:`tvm_pesto.costs.jsonl.read_records`).

    Returns
    -------
    dict
        ``records`` written, ``lines`` read, ``skipped`` [(file, line, reason)].

    Examples
    --------
    >>> from tvm_pesto.costs.store.jsonl import append_record, read_records
    >>> rec = {"key": "k", "backend": "tvm", "target": "llvm", "model": "m", "host": "me"}
    >>> import tempfile
    >>> from pathlib import Path
    >>> d = Path(tempfile.mkdtemp())
    >>> append_record(d / "pass1.jsonl", dict(rec, median_s=2e-3, run="1"))
    >>> append_record(d / "pass2.jsonl", dict(rec, median_s=1e-3, run="2"))
    >>> merge_logs([d / "pass1.jsonl", d / "pass2.jsonl"], d / "merged.jsonl.gz")
    {'records': 1, 'lines': 2, 'skipped': []}
    >>> [rec for _, rec, _ in read_records(d / "merged.jsonl.gz")]
    [{'key': 'k', 'backend': 'tvm', 'target': 'llvm', 'median_s': 0.001, 'runs': [0.002, 0.001], 'model': 'm'}]
    """
    if reduce not in ("min", "median"):
        raise CostError(f"unknown reduction {reduce!r}; use min or median")
    if assume_cpu_kind is not None and not re.fullmatch(r"[^/@\s]+/[^/@\s]+/[^/@\s]+", assume_cpu_kind):
        raise CostError(f"CPU kind {assume_cpu_kind!r} is not vendor/family/model (e.g. AuthenticAMD/25/17: "
                        "lscpu's Vendor ID, CPU family and Model)")
    groups: dict = {}
    skipped: list = []
    lines = 0
    for p in paths:
        for lineno, rec, why in read_records(p):
            lines += 1
            if why is not None:
                skipped.append((str(p), lineno, why))
                continue
            dev = rec.get("device_desc")
            if assume_cpu_kind and isinstance(dev, dict) and dev.get("kind") == "cpu" and not dev.get("cpu_kind"):
                rec["device_desc"] = {**dev, "cpu_kind": assume_cpu_kind}
            try:
                cpu = dev.get("cpu_kind", "") if isinstance(dev, dict) else ""
                k = (rec["key"], rec["backend"], rec["target"], cpu, rec.get("model", ""))
                hash(k)
                float(rec["median_s"])
            except (KeyError, TypeError, ValueError) as e:
                skipped.append((str(p), lineno, f"{type(e).__name__}: {e}"))
                continue
            groups.setdefault(k, {})[rec.get("run", "")] = rec
    if skipped:
        head = ", ".join(f"{os.path.basename(f)}:{n}" for f, n, _ in skipped[:10])
        warnings.warn(f"merge_logs: skipped {len(skipped)} malformed line(s) ({head})", RuntimeWarning, stacklevel=2)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    with open_log(tmp, "w", compressed=str(out).endswith(".gz")) as f:
        for per_run in groups.values():
            recs = list(per_run.values())
            first = dict(recs[0])
            meds = [float(r["median_s"]) for r in recs]
            # a record of a merged log brings every pass it merged (its runs), not its reduction alone
            runs = [float(m) for r in recs for m in (r.get("runs") or [r["median_s"]])]
            if all(m >= 0 for m in meds):
                first["median_s"] = float(np.min(meds) if reduce == "min" else np.median(runs))
            first["runs"] = [float(f"{m:.5g}") for m in runs]
            rec = _compact({k: first[k] for k in MERGED_FIELDS if k in first})
            f.write(json.dumps(rec, separators=(",", ":")) + "\n")
    os.replace(tmp, out)
    return {"records": len(groups), "lines": lines, "skipped": skipped}


def _compact(x):
    """Shorter JSON with the same features: integral floats as ints, other floats to 6
    significant digits, and no string-valued op attributes (layouts; no feature reads them)."""
    if isinstance(x, float):
        if x.is_integer() and abs(x) < 2 ** 53:
            return int(x)
        return float(f"{x:.6g}")
    if isinstance(x, list):
        return [_compact(v) for v in x]
    if isinstance(x, dict):
        out = {}
        for k, v in x.items():
            if k == "attrs" and isinstance(v, dict):
                v = {a: b for a, b in v.items() if not isinstance(b, str)}
            out[k] = _compact(v)
        return out
    return x


def default_log_path() -> Path:
    """``$TVM_PESTO_PROFILE_LOG`` or ``profile.jsonl`` in the cache folder
    (:func:`tvm_pesto.package_data.cache_root`, default ``~/.cache/tvm-pesto``)."""
    env = os.environ.get("TVM_PESTO_PROFILE_LOG")
    if env:
        return Path(env)
    return cache_root() / "profile.jsonl"


__all__ = ["DEFAULT_BACKENDS", "MERGED_FIELDS", "ProfileLog", "ProfileResult", "ProfileSettings", "default_backends", "default_log_path",
           "merge_logs", "profile_module", "profile_zoo"]
