"""How much a shared machine's speed moves under the timer, and how much of it timing against
reference kernels (:mod:`tvm_pesto.costs.measure.interleave`) takes out.

Run it before profiling on a new machine (is it quiet enough for training labels?) and after a
change to the timing method: it is the measurement behind :mod:`tvm_pesto.costs.measure.interleave`.

Two parts:

* ``states``: a NumPy ``exp`` loop timed for ``--seconds`` in ~40 us bursts; prints the
  medians of 250 ms windows relative to the overall median (a machine with speed states
  shows two levels) and the share of windows more than 10 % off.
* ``groups``: every fused group of the ``--models`` compiled in one module (as
  ``measure_groups`` does), timed in ``--passes`` passes, each group both back to back
  (``time_evaluator``, 5 repeats of >= 5 ms) and by a
  :class:`~tvm_pesto.costs.interleave.ReferenceTimer` (a fresh one per pass and model, as
  per measuring batch, sharing the references' fastest bursts as in the product); per model
  the pass-to-pass difference of both (mean over pairs of passes of |a - b| / min(a, b), and
  the ratio of the passes' sums).

Usage::

    python -m tvm_pesto_lab.timing_noise states --seconds 20
    python -m tvm_pesto_lab.timing_noise groups --models mobilenet_v2,vit,bert --passes 3 --json out.json
"""
from __future__ import annotations

import argparse
import itertools
import os
import time

import numpy as np
import tvm

from tvm_pesto.candidates import candidate_function
from tvm_pesto.cluster import as_cluster
from tvm_pesto.cluster.device_thread import enter_device_thread
from tvm_pesto.costs.store.cache import measure_target
from tvm_pesto.costs.measure.interleave import ReferenceTimer, burst_seconds, reference_functions
from tvm_pesto.costs.measure.timing import random_args
from tvm_pesto.graph.analysis import analyze
from tvm_pesto.jsonio import write_json
from .flow_eval import flow_models


def states(seconds: float) -> dict:
    """A NumPy ``exp`` loop timed for ``seconds``: its 250 ms window medians over the overall one."""
    x = np.random.default_rng(0).uniform(-1, 1, 1 << 14).astype("float32")
    y = np.empty_like(x)
    ts = []
    t_end = time.time() + seconds
    while time.time() < t_end:
        t0 = time.perf_counter()
        for _ in range(4):
            np.exp(x, out=y)
        ts.append((t0, time.perf_counter() - t0))
    a = np.array(ts)
    med = float(np.median(a[:, 1]))
    win = ((a[:, 0] - a[0, 0]) // 0.25).astype(int)
    rel = [float(np.median(a[win == k, 1]) / med) for k in range(win.max() + 1) if np.any(win == k)]
    return {"bursts": len(a), "burst_median_s": med, "window_s": 0.25, "window_medians_rel": [round(r, 3) for r in rel],
            "share_windows_off_10pct": float(np.mean(np.abs(np.array(rel) - 1) > 0.1))}


def _passes_diff(labels: list) -> dict:
    pairs = list(itertools.combinations(labels, 2))
    return {"per_group_pct": float(np.mean([np.mean(np.abs(a - b) / np.minimum(a, b)) * 100 for a, b in pairs])),
            "sum_ratio_range": [float(min(a.sum() / b.sum() for a, b in pairs)),
                                float(max(a.sum() / b.sum() for a, b in pairs))]}


def groups(models: list, passes: int) -> dict:
    """Every fused group of ``models`` timed in ``passes`` passes, back to back and interleaved
    with reference kernels: how far the passes differ each way."""
    device = as_cluster("cpu:2").devices[0]
    enter_device_thread(device)
    out = {}
    for name, mod in flow_models(models).items():
        a = analyze(mod)
        funcs = {}
        for i, grp in enumerate(a.groups):
            func = candidate_function(a.rg, grp, lift_constants=False).func
            funcs[f"g{i}"] = func.with_attr("global_symbol", f"g{i}")
        tgt = tvm.target.Target(device.target)
        ex = tvm.compile(tvm.IRModule({**funcs, **reference_functions()}), target=tgt,
                         relax_pipeline=tvm.relax.get_default_pipeline(tgt))
        dev = device.tvm_device()
        vm = tvm.relax.VirtualMachine(ex, dev)
        rng = np.random.default_rng(0)
        args = {f: random_args(fn.params, dev, rng) for f, fn in funcs.items()}
        plain, ref = [], []
        for _ in range(passes):
            timer = ReferenceTimer(vm, dev, rounds=5, burst_s=burst_seconds(5), key=measure_target(device))
            p = []
            for f in funcs:
                vm[f](*args[f])
                timed = vm.time_evaluator(f, dev, number=1, repeat=5, min_repeat_ms=5)(*args[f])
                p.append(float(np.median(timed.results)))
                timer.time(f, args[f])
            plain.append(np.array(p))
            ref.append(np.array([np.median(r) for r in timer.results()]))
        ratio = float(np.mean([r.sum() / p.sum() for r, p in zip(ref, plain)]))
        out[name] = {"groups": len(funcs), "back_to_back": _passes_diff(plain), "interleaved": _passes_diff(ref),
                     "interleaved_over_back_to_back_sum": ratio, "load": [round(x, 2) for x in os.getloadavg()]}
        b, r = out[name]["back_to_back"], out[name]["interleaved"]
        print(f"{name:14s} {len(funcs):4d} groups  back to back {b['per_group_pct']:5.1f} % "
              f"(sums {b['sum_ratio_range'][0]:.2f}-{b['sum_ratio_range'][1]:.2f})   "
              f"interleaved {r['per_group_pct']:5.1f} % "
              f"(sums {r['sum_ratio_range'][0]:.2f}-{r['sum_ratio_range'][1]:.2f})   load {out[name]['load'][0]}",
              flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("part", choices=["states", "groups"])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--models", default="mobilenet_v2,vit,bert,convnext,mlp_mixer")
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    print(f"load average at start {os.getloadavg()[0]:.2f}")
    if args.part == "states":
        res = states(args.seconds)
        print(f"{res['bursts']} bursts; 250 ms window medians / overall: {res['window_medians_rel']}")
        print(f"windows more than 10 % off the median: {res['share_windows_off_10pct']:.0%}")
    else:
        res = groups(args.models.split(","), args.passes)
    print(f"load average at end {os.getloadavg()[0]:.2f}")
    if args.json:
        write_json(args.json, res)


if __name__ == "__main__":
    main()
