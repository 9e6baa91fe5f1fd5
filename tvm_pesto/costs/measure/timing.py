"""Measure each fused group of a Relax graph on a real CPU device.

Every group becomes a small function (:func:`~tvm_pesto.candidates.candidate_function`:
tensor parameters only, so a tuple element read from outside the group, such as a
``split``'s part or a ``batch_norm``'s result, comes in as the tensor it is in the model;
a tuple parameter would add the VM's checks of every field, which can cost more than a
view itself) keyed by its structure with the weights lifted to parameters (so equal shapes
share one measurement) and timed with its own weights bound as constants, as in the model:
kernel times depend on the values (TVM's GELU is several times slower on inputs of scale 3
than of scale 0.3, and a matmul over N(0, 1) weights hands the GELU after it values of scale
~sqrt(K)). All
groups not yet in the cache are compiled in ONE module with the
default pipeline of the device's target, then each is timed with TVM's C++
``time_evaluator`` in a thread pinned to the device's cores, in bursts alternating with a
reference kernel (:mod:`tvm_pesto.costs.measure.interleave`: the ratio survives the speed changes
of a shared machine; median of the rounds). A device
measured over TVM RPC (``Device.rpc_key``) gets the same module uploaded to a server of its
key and timed there (:func:`device_vm`, :mod:`tvm_pesto.costs.measure.remote`).
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager

import numpy as np
import tvm
from tvm import relax

from ...candidates import candidate_function, candidate_key
from ...cluster.device_thread import enter_device_thread
from ...errors import CostError, error_line
from ...graph.subgraph import structural_key
from ..store.cache import MeasureCache, measure_target, measurement_record
from ..table import MIN_COST_S
from .interleave import ReferenceTimer, burst_seconds, reference_functions
from .remote import remote_session

BACKEND = "tvm"
OVERHEAD_KEY = "__vm_call_overhead__"


def random_args(params, dev, rng):
    """Random tensors matching the parameter types (floats ~ N(0,1), ints small)."""
    out = []
    for p in params:
        ty = p.ty
        if isinstance(ty, relax.TensorType):
            shape = tuple(int(s) for s in ty.shape.values)
            dt = str(ty.dtype)
            if dt.startswith("float"):
                arr = rng.standard_normal(shape).astype(dt)
            elif dt == "bool":
                arr = rng.integers(0, 2, shape).astype(bool)
            else:
                arr = rng.integers(0, 2, shape).astype(dt)
            out.append(tvm.runtime.tensor(arr, device=dev))
        elif isinstance(ty, tvm.ir.TupleType) or isinstance(ty, relax.TupleType):
            out.append(tuple(random_args([relax.Var("f", f) for f in ty.fields], dev, rng)))
        else:
            raise CostError(f"cannot make a random value for parameter {p.name!r} of type {ty}")
    return out


def _compile(mod, target):
    tgt = tvm.target.Target(target)
    try:
        return tvm.compile(mod, target=tgt, relax_pipeline=relax.get_default_pipeline(tgt))
    except Exception as e:  # TVM raises many types from deep inside; explain at our boundary
        raise CostError(f"TVM could not compile the measurement module for {target}: "
                        f"{error_line(e)}") from e


def measurable(device) -> bool:
    """Whether ``device`` can be measured: it is on this machine, or behind an RPC tracker."""
    return bool(device.present or device.remote)


@contextmanager
def device_vm(executable, device, name: str = "pesto_measure"):
    """``(vm, dev)``: ``executable``'s VM on ``device``, here or, for a remote device, on a
    server of its RPC key (the session ends with the block; an RPC failure inside raises
    :class:`~tvm_pesto.errors.CostError`)."""
    if device.remote:
        with remote_session(device) as runner:
            yield runner.vm(executable, name), runner.dev
        return
    dev = device.tvm_device()
    yield relax.VirtualMachine(executable, dev), dev


def measure_groups(rg, groups, device, cache: MeasureCache | None = None, repeat: int = 5,
                   min_repeat_ms: int = 5, progress=None, caps=None) -> np.ndarray:
    """Seconds each group takes on ``device`` (median of ``repeat`` timings).

    Parameters
    ----------
    rg : RelaxGraph
    groups : list of list of int
        Node ids of each group (e.g. from :func:`tvm_pesto.graph.fusion.fusion_groups`).
    device : Device
        A present CPU device.
    cache : MeasureCache, optional
        Where measurements are looked up and appended.
    progress : callable(done, total), optional
    caps : list of float or None, optional
        Per group, seconds past which its first two calls end its timing (and over
        :data:`CAP_MIN_S`): the second call is its time, recorded with ``timing.method``
        ``"one call"``.

    Returns
    -------
    ndarray of float64, one entry per group.
    """
    if not measurable(device):
        raise CostError(f"device {device.name} is not on this machine; use the roofline or xgb cost source, or "
                        "measure it over TVM RPC (--rpc-tracker HOST:PORT --rpc-key KEY)")
    cache = cache if cache is not None else MeasureCache()
    tkey = measure_target(device)
    keys = [candidate_key(rg, grp) for grp in groups]
    times = np.full(len(groups), np.nan)
    todo: dict[str, int] = {}
    for gi, k in enumerate(keys):
        rec = cache.get(k, BACKEND, tkey)
        if rec is not None:
            times[gi] = rec["median_s"]
        elif k not in todo:
            todo[k] = gi
    overhead_rec = cache.get(OVERHEAD_KEY, BACKEND, tkey)
    if todo or overhead_rec is None:
        segs = {gi: candidate_function(rg, groups[gi], lift_constants=False) for gi in todo.values()}
        funcs = {f"g{n}": segs[gi].func.with_attr("global_symbol", f"g{n}") for n, gi in enumerate(todo.values())}
        funcs["pesto_call_overhead"] = _overhead_func()
        funcs.update(reference_functions())
        mod = tvm.IRModule(funcs)
        result: dict = {}

        def work():
            try:
                enter_device_thread(device)
                ex = _compile(mod, device.target)
                with device_vm(ex, device, "pesto_groups") as (vm, dev):
                    _time_groups(vm, dev)
            except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
                result["__error__"] = e

        def _time_groups(vm, dev):
            rng = np.random.default_rng(0)
            if overhead_rec is None:
                _time_overhead(vm, dev, device, cache, tkey, repeat)
            if not todo:
                return
            timer = ReferenceTimer(vm, dev, rounds=repeat, burst_s=burst_seconds(min_repeat_ms), key=tkey)
            timed, once = [], {}  # (key, group) timed in bursts; key -> (group, seconds of one call)
            for n, (k, gi) in enumerate(todo.items()):
                seg = segs[gi]
                args = random_args(seg.func.params, dev, rng)
                fname = f"g{n}"
                first = _capped_calls(vm[fname], args, caps[gi] if caps is not None else None)  # warm-up
                if first is not None:
                    once[k] = (gi, first)
                else:
                    timer.time(fname, args)
                    timed.append((k, gi))
                if progress:
                    progress(n + 1, len(todo))
            # written once the batch is done: the references' mean bursts scale every ratio
            done = [(k, gi, reps, timer.describe(i)) for i, (reps, (k, gi)) in enumerate(zip(timer.results(), timed))]
            done += [(k, gi, [first], {"method": "one call", "cap_s": float(caps[gi])})
                     for k, (gi, first) in once.items()]
            for k, gi, reps, how in done:
                rec = measurement_record(k, BACKEND, tkey, reps, [rg.graph.nodes[v] for v in groups[gi]], device)
                rec["timing"] = how
                cache.put(rec)
                result[k] = rec["median_s"]

        th = threading.Thread(target=work, name=f"measure-{device.name}")
        th.start()
        th.join()
        if "__error__" in result:
            err = result["__error__"]
            if isinstance(err, CostError):
                raise err
            raise CostError(f"measuring on {device.name} failed: {type(err).__name__}: {err}") from err
        for gi, k in enumerate(keys):
            if np.isnan(times[gi]):
                times[gi] = result[k]
    overhead = call_overhead_s(device, cache)
    return np.maximum(times - overhead, MIN_COST_S)


#: Only a call over this many seconds ends a group's timing at its cap (``measure_groups``).
CAP_MIN_S = 1e-3


def _time_overhead(vm, dev, device, cache: MeasureCache, tkey: str, repeat: int) -> None:
    """Time and cache the VM's fixed per-call cost on ``device`` (:data:`OVERHEAD_KEY`)."""
    x = tvm.runtime.tensor(np.ones(1, "float32"), device=dev)
    vm["pesto_call_overhead"](x)
    reps = [float(r) for r in vm.time_evaluator("pesto_call_overhead", dev, number=200, repeat=repeat)(x).results]
    cache.put({"key": OVERHEAD_KEY, "backend": BACKEND, "target": tkey, "median_s": float(np.median(reps)),
               "repeats": reps, "op": "call-overhead", "flops": 0.0, "bytes": 8.0,
               "device": device.model or device.name, "time": time.time()})


def _capped_calls(fn, args, cap: float | None) -> float | None:
    """Call ``fn`` once (a warm-up), and again if that took over ``cap`` (a first call pays
    first touches of memory); the second call's seconds when it too took over ``cap`` and
    :data:`CAP_MIN_S`, else None (time it in bursts)."""
    first = _one_call(fn, args)
    if cap is None or first <= max(cap, CAP_MIN_S):
        return None
    second = _one_call(fn, args)
    return second if second > max(cap, CAP_MIN_S) else None


def _one_call(fn, args) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def call_overhead_s(device, cache: MeasureCache) -> float:
    """The measured fixed cost of one VM function call on ``device`` (0 if never measured)."""
    rec = cache.get(OVERHEAD_KEY, BACKEND, measure_target(device))
    return float(rec["median_s"]) if rec is not None else 0.0


def _overhead_func():
    x = relax.Var("x", relax.TensorType((1,), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("pesto_call_overhead", [x]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.add(x, x))
        bb.emit_func_output(y)
    return bb.get()["pesto_call_overhead"].with_attr("global_symbol", "pesto_call_overhead")


#: A whole-model timing outside this factor of its groups' sum is timed twice more and the
#: median of the three kept: on the shared VMs one timing of text_encoder came out at 0.27x
#: its groups and one of mobilenet_v3 at 1.89x, where reruns gave 1.04-1.08x (every other
#: timing in the flow runs of 2026-12-02: 0.91-1.15x), and the factor rescales every
#: TVM-native cost of that model.
WHOLE_PLAUSIBLE = (0.5, 2.0)


def measure_whole(rg, device, cache: MeasureCache | None = None, repeat: int = 5,
                  expect_s: float | None = None) -> float:
    """Seconds the whole function takes on ``device`` as one compiled module (cached).

    With ``expect_s`` (what its fused groups add up to), a timing outside
    :data:`WHOLE_PLAUSIBLE` times that is taken twice more and the median of the three
    kept (the record's ``retimed`` lists them).
    """
    cache = cache if cache is not None else MeasureCache()
    tkey = measure_target(device)
    key = "whole:" + structural_key(rg.func)
    rec = cache.get(key, BACKEND, tkey)
    if rec is not None:
        return float(rec["median_s"])
    mod = tvm.IRModule({"main": rg.func, **reference_functions()})
    box: dict = {}

    def work():
        try:
            enter_device_thread(device)
            ex = _compile(mod, device.target)
            with device_vm(ex, device, "pesto_whole") as (vm, dev):
                args = random_args(rg.func.params, dev, np.random.default_rng(0))
                vm["main"](*args)

                def once():
                    timer = ReferenceTimer(vm, dev, rounds=repeat, burst_s=burst_seconds(20), key=tkey)
                    timer.time("main", args)
                    return timer.results()[0], timer.describe(0)

                runs = [once()]
                ratio = float(np.median(runs[0][0])) / expect_s if expect_s else 1.0
                if not WHOLE_PLAUSIBLE[0] <= ratio <= WHOLE_PLAUSIBLE[1]:
                    runs += [once(), once()]
                box["runs"] = runs
        except BaseException as e:  # noqa: BLE001
            box["err"] = e

    th = threading.Thread(target=work, name=f"measure-whole-{device.name}")
    th.start()
    th.join()
    if "err" in box:
        if isinstance(box["err"], CostError):
            raise box["err"]
        raise CostError(f"measuring the whole model on {device.name} failed: {box['err']}") from box["err"]
    meds = [float(np.median(reps)) for reps, _ in box["runs"]]
    k = int(np.argsort(meds)[len(meds) // 2])  # the median run (the only one when the first was plausible)
    reps, timing = box["runs"][k]
    rec = {"key": key, "backend": BACKEND, "target": tkey, "median_s": meds[k], "repeats": reps,
           "op": "whole-model", "flops": float(rg.graph.total_flops()), "bytes": 0.0,
           "device": device.model or device.name, "time": time.time(), "timing": timing}
    if len(meds) > 1:
        rec["retimed"] = meds
    cache.put(rec)
    return meds[k]


def calibrate(group_costs: np.ndarray, whole_s: float) -> tuple[np.ndarray, float]:
    """Scale isolated group costs so they add up to the measured whole-model time.

    A group timed alone runs with its inputs and weights hot in cache and pays its own
    call; inside the model it does neither. One factor per device corrects both on
    average: the single-device plan's simulated time then equals the real one.
    """
    total = float(np.sum(group_costs))
    if total <= 0 or whole_s <= 0:
        return group_costs, 1.0
    factor = whole_s / total
    return group_costs * factor, factor


#: Least seconds and calls of warm-up before a direct call is timed (a library's first calls
#: after its session is made are slower: allocations, thread pools, caches).
DIRECT_WARMUP_S, DIRECT_WARMUP_CALLS = 0.1, 20


def time_direct(fn, arrays, rounds: int, burst_s: float) -> tuple[list, dict]:
    """Seconds per call of ``fn(*arrays)`` in each of ``rounds`` bursts of at least
    ``burst_s`` and 3 calls, after a warm-up (:data:`DIRECT_WARMUP_S`); and how it was timed."""
    n, t0 = 0, time.perf_counter()
    while n < DIRECT_WARMUP_CALLS or time.perf_counter() - t0 < DIRECT_WARMUP_S:
        fn(*arrays)
        n += 1
        if time.perf_counter() - t0 > 10 * DIRECT_WARMUP_S and n >= 2:  # a slow model: a few calls warm it
            break
    per_round = []
    for _ in range(rounds):
        n, t0 = 0, time.perf_counter()
        while True:
            fn(*arrays)
            n += 1
            spent = time.perf_counter() - t0
            if spent >= burst_s and n >= 3:
                break
        per_round.append(spent / n)
    return per_round, {"method": "direct", "rounds": len(per_round)}
