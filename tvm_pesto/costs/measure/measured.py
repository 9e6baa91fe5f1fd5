"""Measure every candidate on a real device, through the same path the placed module uses.

* TVM-native candidates are timed by :func:`tvm_pesto.costs.measure.timing.measure_groups` (one
  module with every group, default pipeline, C++ ``time_evaluator``).
* Other backends' candidates are built (constants captured), registered as global
  functions, and timed as ``R.call_dps_packed`` calls from a VM in a thread pinned to the
  device, so the cost includes the dispatch into the library, the DLPack views, any layout
  change the library makes and the copy into the output tensor. Both are timed in bursts
  alternating with reference kernels (:mod:`tvm_pesto.costs.measure.interleave`). The VM's fixed per-call
  overhead is subtracted, as for TVM groups (inside a placed segment, a candidate is one
  call among many, not a VM function call of its own).
* A library candidate that is the whole model, of a backend with a call on numpy arrays
  (``Backend.direct``), is timed as that call: a program of that one unit runs it instead
  of the VM (:mod:`tvm_pesto.run.runtime`), with ONNX Runtime's workers spinning on a device
  of every core.

Results go to the :class:`~tvm_pesto.costs.store.cache.MeasureCache` keyed by (structural key of
the weight-lifted candidate function, backend, target), so equal shapes are measured once
and a second run measures nothing. A candidate its backend cannot build gets the record
``median_s = -1`` with the reason (infeasible; the search skips it).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relax

from ...backends import get_backend
from ...candidates.generate import CandidateSet, candidate_function, candidate_key
from ...cluster.device_thread import enter_device_thread
from ...errors import CostError, PestoError
from ...graph.fusion import fusion_groups
from ...graph.subgraph import out_ty_of
from ..store.cache import MeasureCache, measure_target, measurement_record
from ..table import MIN_COST_S
from .build_time import record as record_build
from .interleave import ReferenceTimer, burst_seconds, reference_functions
from .screen import screen_measurement
from .timing import (OVERHEAD_KEY, calibrate, call_overhead_s, measurable, measure_groups, measure_whole, random_args,
                     time_direct)

INFEASIBLE = -1.0


@dataclass
class MeasureReport:
    """What a measurement pass did."""

    measured: int = 0
    cached: int = 0
    infeasible: dict = field(default_factory=dict)  # candidate index -> reason
    seconds: float = 0.0
    scaled: int = 0  # regions scaled from another core count (screened)
    screened: dict = field(default_factory=dict)  # Screen.summary()


def _device_group(device) -> tuple:
    return (measure_target(device), device.cores, device.kind)


def _wrapper(gname: str, params, out_ty, name: str) -> relax.Function:
    ps = [relax.Var(f"a{k}", p.ty) for k, p in enumerate(params)]
    bb = relax.BlockBuilder()
    with bb.function(name, ps):
        with bb.dataflow():
            y = bb.emit(relax.call_dps_packed(gname, ps, out_ty))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()[name].with_attr("global_symbol", name)


def measure_candidates(cs: CandidateSet, device, cache: MeasureCache | None = None, repeat: int = 5,
                       min_repeat_ms: int = 5, report: MeasureReport | None = None, progress=None,
                       screened: bool = False) -> np.ndarray:
    """Seconds of every candidate on ``device``; ``inf`` where its backend cannot build it.
    ``screened``: a library's regions measured on another core count of this CPU are sampled
    and the rest scaled from there (:mod:`~tvm_pesto.costs.measure.screen`).

    Parameters
    ----------
    cs : CandidateSet
    device : Device
        A present CPU device.
    cache : MeasureCache, optional
    report : MeasureReport, optional
        Filled with counts of measured / cached / infeasible candidates.

    Returns
    -------
    ndarray of float64, one entry per candidate.

    Examples
    --------
    >>> import tvm_pesto
    >>> from tvm_pesto.candidates import placement_candidates
    >>> from tvm_pesto.cluster import parse_cluster
    >>> from tvm_pesto.candidates.examples import tiny_mlp
    >>> cs = placement_candidates(tvm_pesto.analyze(tiny_mlp()[0]).rg)
    >>> costs = measure_candidates(cs, parse_cluster("cpu:1").devices[0])
    >>> costs.shape == (len(cs),), bool((costs > 0).all())
    (True, True)
    """
    t0 = time.perf_counter()
    if not measurable(device):
        raise CostError(f"device {device.name} is not on this machine; candidates can only be measured on "
                        "present devices, or over TVM RPC (--rpc-tracker HOST:PORT --rpc-key KEY)")
    cache = cache if cache is not None else MeasureCache()
    report = report if report is not None else MeasureReport()
    tkey = measure_target(device)
    costs = np.full(len(cs), np.nan)
    native_set = {i for i, c in enumerate(cs) if getattr(get_backend(c.backend), "native", False)}
    todo, whole = _look_up_library(cs, device, cache, tkey, costs, report, native_set)
    # the libraries first, a batch of at most the model's weights at a time, each batch's
    # units released once timed: a large model's regions would otherwise hold its weights
    # many times over
    native = sorted(native_set)
    todo, native, scr = screen_measurement(cs, device, cache, todo, native) if screened else (todo, native, None)
    run = _Run(device, cache, tkey, costs, report, repeat, min_repeat_ms, progress)
    for batch in _batches(cs, todo):
        whole |= _measure_batch(cs, batch, run)
    _measure_native(cs, native, device, cache, tkey, costs, report, repeat, min_repeat_ms)
    if scr is not None:  # the rest scaled; a backend none of whose sample ran here measured
        left = scr.fill(costs, cache, tkey, report.infeasible)
        for batch in _batches(cs, {e: v for e, v in left.items() if v[0] not in native_set}):
            whole |= _measure_batch(cs, batch, run)
        native += (more := sorted(i for v in left.values() for i in v if i in native_set))
        _measure_native(cs, more, device, cache, tkey, costs, report, repeat, min_repeat_ms)
        report.screened, report.scaled = scr.summary(), scr.scaled
    # scaled TVM groups are a sibling's calls: their VM overhead comes off with the libraries'
    _subtract_overhead(cs.rg, costs, set(native) | whole, device, cache, tkey, repeat, min_repeat_ms)
    report.seconds += time.perf_counter() - t0
    return costs


def _measure_native(cs, native: list, device, cache, tkey, costs, report, repeat, min_repeat_ms) -> None:
    """Fill ``costs`` of the TVM-native candidates ``native``: the spine's group measurement
    (it caches and subtracts overhead), each group's timing ended after one call where that
    call takes :data:`SLOW_FACTOR` times a library candidate holding the group."""
    if native:
        before = len(cache)
        had_overhead = cache.get(OVERHEAD_KEY, "tvm", tkey) is not None
        costs[native] = measure_groups(cs.rg, [list(cs[i].nodes) for i in native], device, cache,
                                       repeat=repeat, min_repeat_ms=min_repeat_ms,
                                       caps=_caps(cs, native, costs))
        new = len(cache) - before - (0 if had_overhead else 1)
        report.measured += new
        report.cached += len(native) - new


#: A TVM-native group whose first call takes this many times the best library candidate
#: holding it is not timed further: that call is its cost (an untuned TVM matmul of a
#: ViT-B/16 took 1.3 s a call where ONNX Runtime's whole layer took milliseconds).
SLOW_FACTOR = 3.0


def _caps(cs, native: list, costs) -> list:
    """Per candidate of ``native``: :data:`SLOW_FACTOR` times the least measured cost of a
    library candidate whose nodes hold all of its nodes (None where none does)."""
    by_node: dict = {}
    skip = set(native)
    for j, c in enumerate(cs):
        if j not in skip and np.isfinite(costs[j]):
            for v in c.nodes:
                by_node.setdefault(v, []).append(j)
    caps = []
    for i in native:
        nodes = set(cs[i].nodes)
        holders = [j for j in by_node.get(cs[i].nodes[0], ()) if nodes <= set(cs[j].nodes)]
        caps.append(SLOW_FACTOR * min(costs[j] for j in holders) if holders else None)
    return caps


#: A batch of library candidates measured together holds at most the model's weights or this
#: many bytes of weights, whichever is more (each batch compiles and warms its own timing module).
BATCH_BYTES = 512 << 20


def _batches(cs, todo: dict):
    """``todo`` (:func:`_look_up_library`) in parts whose candidates hold at most the model's weights
    or :data:`BATCH_BYTES` together (at least one entry a part), one region's libraries in a row."""
    rg = cs.rg
    limit = max(sum(n.param_bytes for n in rg.graph.nodes), BATCH_BYTES)
    part: dict = {}
    held = 0
    for entry, idxs in sorted(todo.items(), key=lambda e: e[0][0]):
        w = sum(rg.graph.nodes[v].param_bytes for v in cs[idxs[0]].nodes)
        if part and held + w > limit:
            yield part
            part, held = {}, 0
        part[entry] = idxs
        held += w
    if part:
        yield part


@dataclass(frozen=True)
class _Run:
    """What the steps of one :func:`measure_candidates` call share.

    Attributes
    ----------
    device, cache, tkey : Device, MeasureCache, str
        Where the candidates are timed, the records read and written, ``device``'s key in them.
    costs, report : ndarray, MeasureReport
        Seconds per candidate and the counts of measured / cached / infeasible ones, filled in.
    repeat, min_repeat_ms, progress : int, int, callable(measured, total) or None
        Timed repeats, least milliseconds a repeat runs, and the progress callback.
    """

    device: object
    cache: MeasureCache
    tkey: str
    costs: np.ndarray
    report: MeasureReport
    repeat: int
    min_repeat_ms: int
    progress: object


def _measure_batch(cs, batch: dict, run: _Run) -> set:
    """Build, time and release one batch of library entries (:func:`_batches`); the
    candidates timed as their direct call."""
    wrappers, jobs = _build_library(cs, batch, run)
    try:
        if not jobs:
            return set()
        return _time_library(cs, wrappers, jobs, run)
    finally:
        _release(jobs)


def _release(jobs: list) -> None:
    """Drop the units a measurement built (their sessions and weights); a placed model builds
    the ones it keeps again."""
    by_backend: dict = {}
    for _fname, _k, bname, _idxs, _params, _direct, gname in jobs:
        if gname is not None:
            by_backend.setdefault(bname, []).append(gname)
    for bname, names in by_backend.items():
        get_backend(bname).release(names)


def _look_up_library(cs, device, cache, tkey, costs, report, native_set: set) -> tuple[dict, set]:
    """Fill ``costs`` of the other backends' candidates that need no measuring: ``inf`` where
    the backend does not run on ``device`` (or only over RPC), the cached seconds where the
    cache holds a usable record (:func:`_reusable`).

    Returns ``(todo, whole)``: ``{(structural key of the lifted function, backend): [candidate
    indices]}`` still to measure, and the candidates whose cached time is of the direct call.
    """
    rg = cs.rg
    todo: dict[tuple, list] = {}  # (key, backend) -> [candidate indices]
    whole: set = set()  # candidates timed as their direct call: no VM overhead to subtract
    for i, c in enumerate(cs):
        if i in native_set:
            continue
        if not get_backend(c.backend).supports_device(device):
            costs[i] = np.inf
            continue
        if device.remote:  # a library backend runs in this process only, not on an RPC server
            costs[i] = np.inf
            report.infeasible[i] = (f"{c.backend} candidates are not measured over RPC (only TVM-native ones are); "
                                    "measure on the device's own machine")
            continue
        k = candidate_key(rg, c.nodes)
        rec = cache.get(k, c.backend, tkey)
        whole_direct = get_backend(c.backend).direct and len(c.nodes) == len(rg.graph.nodes)
        rec = _reusable(rec, c.backend, whole_direct)
        if rec is not None:
            ms = float(rec["median_s"])
            costs[i] = np.inf if ms < 0 else ms
            if ms >= 0 and whole_direct:
                whole.add(i)
            if ms < 0:
                report.infeasible[i] = rec.get("infeasible", "cached as infeasible")
            report.cached += 1
            continue
        todo.setdefault((k, c.backend), []).append(i)
    return todo, whole


def _reusable(rec: dict | None, backend: str, whole_direct: bool) -> dict | None:
    """``rec``, the cached record of a library candidate, unless it must be measured again."""
    if rec is not None and whole_direct and (rec.get("timing") or {}).get("method") != "direct":
        return None  # the whole model timed through the VM, not as the direct call a one-unit program makes
    if rec is not None and float(rec["median_s"]) < 0 and \
            str(rec.get("backend_version")) != str(get_backend(backend).version):
        return None  # an infeasible mark from other converter code: try again
    return rec


def _build_library(cs, todo: dict, run: _Run) -> tuple[dict, list]:
    """Build one candidate of each ``todo`` entry with its backend (the real function, with
    weights) and wrap the result in a VM function; a build that fails marks the entry's
    candidates infeasible.

    Returns ``(wrappers, jobs)``: ``{name: wrapper function}`` and ``[(name, key, backend,
    candidate indices, wrapper params, direct call or None, the unit's global name or None
    where it was built before)]``.
    """
    rg, device = cs.rg, run.device
    jobs = []  # (name, key, backend, idx list, wrapper params, direct call)
    wrappers = {}
    for n, ((k, bname), idxs) in enumerate(todo.items()):
        i0 = idxs[0]
        c = cs[i0]
        bk = get_backend(bname)
        real = candidate_function(rg, c.nodes, lift_constants=False)
        held = bk.is_built(real.func, device)  # built before (a placed model's unit): not ours to release
        try:
            gname = bk.build(real.func, device)
        except PestoError as e:
            _mark_infeasible(run, k, bname, c, str(e), idxs)
            continue
        record_build(bk.built(gname), len(c.nodes))
        fname = f"c{n}"
        wrappers[fname] = _wrapper(gname, real.func.params, out_ty_of(real.func), fname)
        # the whole model as one unit runs as the library's own call (run.runtime's direct path)
        direct = bk.direct_call(gname) if bk.direct and len(c.nodes) == len(rg.graph.nodes) else None
        jobs.append((fname, k, bname, idxs, real.func.params, direct, None if held else gname))
    return wrappers, jobs


def _time_library(cs, wrappers: dict, jobs: list, run: _Run) -> set:
    """Time the built ``jobs`` (:func:`_time_wrappers`), cache their records and fill their
    candidates' ``costs``. Returns the candidates timed as their direct call."""
    rg, device, cache, tkey, costs, report = cs.rg, run.device, run.cache, run.tkey, run.costs, run.report
    whole: set = set()
    results, timings = _time_wrappers(wrappers, jobs, device, run.repeat, run.min_repeat_ms)
    for fname, k, bname, idxs, _, direct, _gname in jobs:
        res = results.get(fname)
        c = cs[idxs[0]]
        if isinstance(res, str):
            _mark_infeasible(run, k, bname, c, res, idxs)
            continue
        rec = measurement_record(k, bname, tkey, res, [rg.graph.nodes[v] for v in c.nodes], device)
        rec["timing"] = timings[fname]
        cache.put(rec)
        report.measured += 1
        for i in idxs:
            costs[i] = rec["median_s"]
            if direct is not None:
                whole.add(i)
        if run.progress:
            run.progress(report.measured, len(jobs))
    return whole


def _subtract_overhead(rg, costs, no_overhead: set, device, cache, tkey, repeat: int, min_repeat_ms: int) -> None:
    """Subtract the VM's per-call overhead from the finite ``costs`` of the candidates not in
    ``no_overhead`` (the native ones, already without it, and those timed as a direct call),
    floored at :data:`~tvm_pesto.costs.table.MIN_COST_S`."""
    ext = np.array([i not in no_overhead for i in range(len(costs))], dtype=bool)
    fin = np.isfinite(costs) & ext
    if fin.any() and cache.get(OVERHEAD_KEY, "tvm", tkey) is None:
        # no TVM-native candidate was measured here: time the VM call overhead alone, so a
        # library candidate's cost never depends on which candidates happened to be measured
        measure_groups(rg, [], device, cache, repeat=repeat, min_repeat_ms=min_repeat_ms)
    overhead = call_overhead_s(device, cache)
    costs[fin] = np.maximum(costs[fin] - overhead, MIN_COST_S)


def _mark_infeasible(run: _Run, key, backend, cand, reason: str, idxs) -> None:
    """Cache ``key`` on ``backend`` as infeasible for ``reason`` (``cand`` is one of its
    candidates), and mark its candidates ``idxs`` so in ``run.costs`` and ``run.report``."""
    run.cache.put({"key": key, "backend": backend, "target": run.tkey, "median_s": INFEASIBLE,
                   "infeasible": reason[:500], "backend_version": str(get_backend(backend).version),
                   "op": cand.pattern, "device": run.device.model or run.device.name, "time": time.time()})
    for i in idxs:
        run.costs[i] = np.inf
        run.report.infeasible[i] = reason


def _time_wrappers(wrappers: dict, jobs: list, device, repeat: int, min_repeat_ms: int) -> tuple[dict, dict]:
    """Compile all wrappers in one module and time each in a thread pinned to ``device``,
    against the reference kernels (:class:`~tvm_pesto.costs.measure.interleave.ReferenceTimer`).

    Returns ``({name: [seconds per round]} or {name: "error text"} for a failed call,
    {name: how it was timed}``).
    """
    result: dict = {}
    timings: dict = {}

    def work():
        try:
            enter_device_thread(device)
            tgt = tvm.target.Target(device.target)
            ex = tvm.compile(tvm.IRModule({**wrappers, **reference_functions()}), target=tgt,
                             relax_pipeline=relax.get_default_pipeline(tgt))
            dev = device.tvm_device()
            vm = relax.VirtualMachine(ex, dev)
            rng = np.random.default_rng(0)
            timer = ReferenceTimer(vm, dev, rounds=repeat, burst_s=burst_seconds(min_repeat_ms), key=measure_target(device))
            timed = {}  # fname -> index in the timer's results
            for fname, _k, _b, _idxs, params, direct, _gname in jobs:
                try:
                    args = random_args(params, dev, rng)
                    vm[fname](*args)  # warm-up (also creates ORT sessions for this thread's cores)
                    vm[fname](*args)
                    if direct is not None:
                        result[fname], timings[fname] = time_direct(direct, [a.numpy() for a in args], repeat,
                                                                     burst_seconds(min_repeat_ms))
                    else:
                        timed[fname] = timer.time(fname, args)
                except Exception as e:  # noqa: BLE001 - a failing library call makes it infeasible
                    msg = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
                    result[fname] = f"the backend failed when run: {msg[:300]}"
            reps = timer.results()
            for fname, i in timed.items():
                result[fname] = reps[i]
                timings[fname] = timer.describe(i)
        except BaseException as e:  # noqa: BLE001 - reported in the caller's thread
            result["__error__"] = e

    th = threading.Thread(target=work, name=f"measure-cands-{device.name}")
    th.start()
    th.join()
    if "__error__" in result:
        err = result["__error__"]
        raise CostError(f"measuring backend candidates on {device.name} failed: {type(err).__name__}: {err}") from err
    return result, timings


def measure_cost_table(cs: CandidateSet, cluster, cache: MeasureCache | None = None,
                       report: MeasureReport | None = None, progress=None, repeat: int = 5,
                       screened: bool = False) -> np.ndarray:
    """``[candidates, devices]`` seconds; devices with the same target/cores share one measurement.
    ``repeat``: timed repeats (of at least 5 ms each) per candidate, the median kept;
    ``screened``: :func:`measure_candidates`'s."""
    cache = cache if cache is not None else MeasureCache()
    out = np.zeros((len(cs), cluster.num_devices))
    done: dict[tuple, np.ndarray] = {}
    for j, dev in enumerate(cluster.devices):
        k = _device_group(dev)
        if k not in done:
            done[k] = measure_candidates(cs, dev, cache, repeat=repeat, report=report, progress=progress,
                                         screened=screened)
        out[:, j] = done[k]
    return out


#: The whole model's untuned TVM build is not timed (for calibration) where its groups add
#: up to more seconds than this a call: its timing takes seven calls or more.
WHOLE_MAX_S = 1.0


def _worth_timing_whole(groups_s: float, library_s) -> bool:
    """Whether TVM's whole model, whose groups add up to ``groups_s``, is worth timing beside
    libraries whose whole-model candidates take ``library_s``."""
    finite = [float(x) for x in library_s if np.isfinite(x)]
    return groups_s <= WHOLE_MAX_S and not (finite and groups_s > SLOW_FACTOR * min(finite))


def calibrate_native(cs: CandidateSet, cluster, table: np.ndarray, cache: MeasureCache) -> dict[int, float]:
    """Scale the TVM-native columns of ``table`` in place so that, per device, the fusion
    groups add up to the whole model's measured time (:func:`~tvm_pesto.costs.measure.timing.calibrate`).

    A group timed alone runs with its inputs and weights hot in cache and pays its own
    call; inside the model it does neither. The factor of the fusion-group cover is applied
    to every native candidate of that device; other backends' calls are left as measured.
    Returns device index -> factor. Devices without a complete fusion-group cover are
    skipped, and so are those where the cover is not worth timing whole (seconds of
    untuned TVM a call: over :data:`WHOLE_MAX_S`, or :data:`SLOW_FACTOR` times a library's
    whole-model candidate).
    """
    native = np.array([bool(getattr(get_backend(c.backend), "native", False)) for c in cs], dtype=bool)
    index = {c.nodes: i for i, c in enumerate(cs) if native[i]}
    groups = [index.get(tuple(sorted(g))) for g in fusion_groups(cs.rg.graph)]
    if not native.any() or any(i is None for i in groups):
        return {}
    whole = [i for i in cs.whole_model() if not native[i]]
    factors: dict[int, float] = {}
    done: dict[tuple, float | None] = {}
    for j, dev in enumerate(cluster.devices):
        k = _device_group(dev)
        if k not in done:
            parts = table[groups, j]
            if not _worth_timing_whole(float(np.sum(parts)), table[whole, j]):
                done[k] = None
                continue
            _, done[k] = calibrate(parts, measure_whole(cs.rg, dev, cache, expect_s=float(np.sum(parts))))
        if done[k] is None:
            continue
        factors[j] = float(done[k])
        table[native, j] *= done[k]
    return factors


__all__ = ["MeasureReport", "calibrate_native", "measure_candidates", "measure_cost_table"]
